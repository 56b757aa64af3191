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

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
