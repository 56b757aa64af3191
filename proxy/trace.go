package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// Tracing. With a TracerProvider (Options), every protected request is a
// server span, its parent taken from the client's traceparent; each store
// operation and the upstream call are client spans under it, and the
// upstream gets a traceparent naming its call. The attempt that claims a
// key stores its span context in the record, so that a replay, a 409 or a
// 422 for that key links to the execution: a retry's trace points at the
// trace that charged. Spans carry the route, the outcome, whether the
// answer was replayed and the hashed key, never the raw key, the
// principal or a body. Without a provider none of this runs.

const tracerName = "github.com/idemproxy/idemproxy/proxy"

// TraceTrust says whose incoming trace context may parent a span.
type TraceTrust int

// The values of TraceTrust.
const (
	TraceTrustTrustedPeers TraceTrust = iota // trusted proxies only (identity.trusted_proxies)
	TraceTrustAll                            // every peer
	TraceTrustNone                           // nobody: every request starts a trace
)

// tracing is a Handler's tracer and propagator; nil when tracing is off.
type tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	trust      TraceTrust
}

// trusts reports whether a peer's incoming trace context may parent.
func (t *tracing) trusts(trustedPeer bool) bool {
	return t.trust == TraceTrustAll || t.trust == TraceTrustTrustedPeers && trustedPeer
}

func newTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator, trust TraceTrust, version string) *tracing {
	if tp == nil {
		return nil
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	scope := []trace.TracerOption{trace.WithSchemaURL(semconv.SchemaURL)}
	if version != "" {
		scope = append(scope, trace.WithInstrumentationVersion(version))
	}
	t := &tracing{tracer: tp.Tracer(tracerName, scope...), propagator: prop, trust: trust}
	return t
}

// hostPort is server.address and server.port for addr (host or
// host:port); the port defaults to defaultPort when addr has none.
func hostPort(addr, defaultPort string) []attribute.KeyValue {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, defaultPort
	}
	out := []attribute.KeyValue{semconv.ServerAddress(host)}
	if n, err := strconv.Atoi(port); err == nil {
		out = append(out, semconv.ServerPort(n))
	}
	return out
}

// spanSink is a traced exchange's traceSink: what its attempt did, as
// client spans under the request's server span, and links from it.
type spanSink struct {
	t     *tracing
	ctx   context.Context
	span  trace.Span
	store Store
}

// lookupSpan records a reconcile lookup, which started at start, as a
// client span (HTTP semantic conventions) with its result; an unresolved
// lookup is an error.
func (s *spanSink) lookupSpan(start time.Time, ans lookupAnswer) {
	if s.span == nil {
		return
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(http.MethodGet),
		attribute.String("idemproxy.reconcile.result", ans.result),
	}
	if ans.upstreamStatus != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(ans.upstreamStatus))
	}
	_, sp := s.t.tracer.Start(s.ctx, http.MethodGet,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if ans.result == lookupUnresolved {
		sp.SetStatus(codes.Error, ans.why)
	}
	sp.End()
}

// startTrace starts the exchange's server span, continuing the client's
// trace, and carries it in x.r's context. It is named and attributed by
// the HTTP semantic conventions: "{method} {http.route}".
func (x *exchange) startTrace() {
	attrs := []attribute.KeyValue{
		semconv.HTTPRoute(x.rt.httpRoute),
		semconv.URLPath(x.path),
		attribute.String("idemproxy.route", x.rt.name),
		// The id the app gets as X-Request-Id, which the log lines carry.
		attribute.String("idemproxy.request_id", x.requestID),
	}
	x.r, x.span = x.h.tracing.serverSpan(x.r, x.trusted, x.start, x.r.Method+" "+x.rt.httpRoute, attrs)
	// The attempt's store calls and lookups are children of the span; it
	// tells the span what it did.
	x.ctx = x.r.Context()
	x.seen = &spanSink{t: x.h.tracing, ctx: x.r.Context(), span: x.span, store: x.h.store}
	if sc := x.span.SpanContext(); sc.IsValid() {
		x.trace = claim.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID()}
	}
	if sc := x.span.SpanContext(); sc.HasTraceID() {
		x.traceID = sc.TraceID().String()
	}
}

// serverSpan starts a server span for r, continuing the client's trace
// when its peer is trusted (tracing.trust_incoming), and returns r
// carrying it. From an untrusted peer the trace context is at most a link:
// it starts no trace of ours, forces no sampling, and its tracestate and
// baggage go no further.
func (t *tracing) serverSpan(r *http.Request, trusted bool, start time.Time, name string, attrs []attribute.KeyValue) (*http.Request, trace.Span) {
	ctx := r.Context()
	var opts []trace.SpanStartOption
	if t.trusts(trusted) {
		ctx = t.propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
	} else {
		remote := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(r.Header)))
		opts = append(opts, trace.WithNewRoot())
		if remote.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: remote.WithTraceFlags(0), Attributes: []attribute.KeyValue{attribute.String("idemproxy.link", "untrusted_parent")}}))
		}
		for _, h := range []string{"Traceparent", "Tracestate", "Baggage"} {
			r.Header.Del(h)
		}
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	defaultPort := "80"
	if scheme == "https" {
		defaultPort = "443"
	}
	attrs = append(attrs,
		semconv.HTTPRequestMethodKey.String(r.Method),
		semconv.URLScheme(scheme),
	)
	attrs = append(attrs, hostPort(r.Host, defaultPort)...)
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		attrs = append(attrs, semconv.ClientAddress(host))
	}
	if ua := r.UserAgent(); ua != "" {
		attrs = append(attrs, semconv.UserAgentOriginal(ua))
	}
	opts = append(opts, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	ctx, sp := t.tracer.Start(ctx, name, opts...)
	return r.WithContext(ctx), sp
}

// endServerSpan ends a pass-through request's span with its status: an
// error, with error.type, from 500 on (the HTTP conventions).
func endServerSpan(sp trace.Span, status int) {
	sp.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 {
		sp.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		sp.SetStatus(codes.Error, http.StatusText(status))
	}
	sp.End()
}

// endTrace ends the server span with the exchange's outcome.
func (x *exchange) endTrace() {
	if x.span == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("idemproxy.outcome", x.outcome),
		attribute.Bool("idemproxy.replayed", x.outcome == outcomeReplayed),
		semconv.HTTPResponseStatusCode(x.status),
	}
	if x.a != nil && x.a.hashedKey != "" {
		attrs = append(attrs, attribute.String("idemproxy.key", x.a.hashedKey))
	}
	if x.original != "" {
		attrs = append(attrs, attribute.String("idemproxy.original_request_id", x.original))
	}
	x.span.SetAttributes(attrs...)
	if x.status >= 500 || x.outcome == outcomeStoreError || x.outcome == outcomeFenceLost || x.outcome == outcomeStoreUnavailable || x.outcome == outcomeRecordUnreadable {
		// error.type (the HTTP conventions): the status from 500 on, else
		// the outcome that made it an error.
		errType := x.outcome
		if x.status >= 500 {
			errType = strconv.Itoa(x.status)
		}
		x.span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		x.span.SetStatus(codes.Error, x.outcome)
	}
	x.span.End()
}

// linkTo links the request's span to the span of the attempt that
// claimed rec: the execution a replay, a 409 or a 422 refers to.
func (s *spanSink) linkTo(rec *claim.Record) {
	if s.span == nil || rec.Trace.IsZero() {
		return
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    rec.Trace.TraceID,
		SpanID:     rec.Trace.SpanID,
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
	s.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
		attribute.String("idemproxy.link", "execution"),
		attribute.String("idemproxy.original_request_id", rec.RequestID),
	}})
}

// storeSpan records store operation op, which started at start and ended
// now with err, as a client span the store describes (claim.Span: named
// after what it sent, with its attributes).
// A lost lease is an answer, not a failure; every other error marks the
// span with error.type and an error status.
func (s *spanSink) storeSpan(op string, start time.Time, err error) {
	if s.span == nil {
		return
	}
	t := s.t
	d := s.store.Span(op)
	_, sp := t.tracer.Start(s.ctx, d.Name,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithAttributes(d.Attributes...),
		trace.WithAttributes(attribute.String("idemproxy.store.operation", op)))
	if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
		sp.SetAttributes(semconv.ErrorTypeKey.String(storeErrorType(err)))
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// storeErrorType is a store error's low-cardinality error.type.
func storeErrorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return "timeout"
	case errors.Is(err, claim.ErrCorrupt):
		return "record_unreadable"
	case errors.Is(err, claim.ErrFull):
		return "store_full"
	case errors.Is(err, claim.ErrUnavailable):
		return "unavailable"
	}
	return "_OTHER"
}

// upstreamSpan starts the client span of an upstream call and puts its
// traceparent on req, which is the outgoing request ReverseProxy built.
func (x *exchange) upstreamSpan(req *http.Request) (*http.Request, trace.Span) {
	defaultPort := "80"
	if req.URL.Scheme == "https" {
		defaultPort = "443"
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.URLFull(redactedURL(req.URL)),
	}
	attrs = append(attrs, hostPort(req.URL.Host, defaultPort)...)
	ctx, sp := x.h.tracing.tracer.Start(req.Context(), req.Method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrs...))
	x.h.tracing.propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req.WithContext(ctx), sp
}

// redactedURL is u without user info and with the query's values
// redacted, as the semantic conventions ask of url.full.
func redactedURL(u *url.URL) string {
	c := *u
	c.User = nil
	if c.RawQuery != "" {
		q := c.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// endUpstreamSpan ends an upstream call's span.
func endUpstreamSpan(sp trace.Span, resp *http.Response, err error) {
	switch {
	case err != nil:
		sp.SetAttributes(semconv.ErrorTypeKey.String(clientErrorType(err)))
		sp.SetStatus(codes.Error, err.Error())
	default:
		sp.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
		if resp.StatusCode >= 500 {
			sp.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
			sp.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
		}
	}
	sp.End()
}

// clientErrorType is a failed upstream call's error.type: timeout,
// cancelled, or the error's type, as the semantic conventions suggest
// when no better low-cardinality name exists.
func clientErrorType(err error) string {
	switch {
	case isTimeout(err):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	return semconv.ErrorType(err).Value.AsString()
}
