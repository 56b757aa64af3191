package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.22.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// exchange is one protected request on its way through the protocol: the
// writer and the request, admission, respond, finishing and tracing. The
// protocol on its key is its attempt's.
type exchange struct {
	// h is the HTTP front the request came through, p the protocol its
	// attempt runs on; rt is its route.
	h  *Handler
	p  *protocol
	rt *route
	// requestID and start are the request's; trace its span as a record
	// stores it, traceID its trace id (logged on every line), seen what
	// hears the attempt's store calls and lookups for the span: zero when
	// not traced.
	requestID string
	start     time.Time
	trace     claim.TraceContext
	traceID   string
	seen      traceSink
	// a is the protocol on the request's key: claiming, answering from a
	// record, waiting; nil until the request is admitted, then built
	// whole from the exchange's front and what admission found. The
	// exchange holds it, never embeds it, so that what is HTTP (the
	// exchange's methods) and what is the protocol (x.a's) read apart.
	a    *attempt
	fwd  *forwarder
	w    http.ResponseWriter
	r    *http.Request
	path string
	// trusted says whether the peer is a trusted proxy.
	trusted bool

	// res is what finish counts and logs of the request, noted in one
	// place (note) as its steps decide it.
	res result
	// timedOut is set once the client's 504 was counted, logged and
	// traced (answeredTimeout): finish then has nothing left to record.
	timedOut atomic.Bool
	// span is the request's server span; nil when tracing is off.
	span trace.Span
	// webhookResult, when set, is the delivery's result label (webhook.go)
	// where the outcome does not say it.
	webhookResult string

	// bufs are the pooled buffers the request's body and the answer were
	// read into, and the bodies lent over them (pool.go).
	bufs loans
}

// front is what the exchange knows of its request before the protocol on
// its key starts, for its attempt to be built on (newAttempt).
func (x *exchange) front() front {
	return front{p: x.p, rt: x.rt, ctx: x.r.Context(), requestID: x.requestID, start: x.start, trace: x.trace, traceID: x.traceID, seen: x.seen}
}

// log is the handler's logger, with the trace id on every line when the
// request is traced.
func (x *exchange) log() *slog.Logger {
	if x.traceID != "" {
		return x.h.log.With("trace_id", x.traceID)
	}
	return x.h.log
}

// result is what finish counts and logs of a request, and what its span
// says: what its steps decided, noted in the order they decided it.
type result struct {
	// outcome is the request's outcome label; detail what its log line
	// says of it, and fallback what it says when nothing noted a detail.
	outcome, detail, fallback string
	// status is the answer's status, zero while none was written.
	status int
	// upstream is how long the upstream took, zero when not forwarded.
	upstream time.Duration
	// original is the request id of the attempt a replay answers with.
	original string
	// late is set when the client was answered 504 while the upstream
	// call went on past upstream.timeout, and that call settled.
	late bool
}

// note records r over what was noted before, field by field: each field
// r sets replaces the earlier one. It is the one place a request's result
// is written, on the handler's goroutine.
func (x *exchange) note(r result) {
	if r.outcome != "" {
		x.res.outcome = r.outcome
	}
	switch {
	case r.detail != "":
		x.res.detail = r.detail
	case r.fallback != "" && x.res.detail == "":
		x.res.detail = r.fallback
	}
	if r.status != 0 {
		x.res.status = r.status
	}
	if r.upstream != 0 {
		x.res.upstream = r.upstream
	}
	if r.original != "" {
		x.res.original = r.original
	}
	if r.late {
		x.res.late = true
	}
}

// admitted is what a route's admission let through.
type admitted struct {
	as   admittedAs
	body []byte
	// message, on a grpc route, is the call's request message
	// (decompressed): what its fingerprint covers instead of body.
	message []byte
	// legacy, on a webhook route, are the keys earlier releases stored
	// the delivery under (useLegacyKey).
	legacy []legacyKey
}

// inflate decompresses a stored body for its replay into a buffer of the
// length its frame declares, held in the buffer budget as an upstream's
// answer is, and never longer than the route's max_response_body (a
// record planted in Redis can declare anything: one larger than the route
// stores is not replayable here). It returns the reply when it cannot.
func (x *exchange) inflate(rec *claim.Record) *reply {
	n, err := rec.InflatedLen()
	if err != nil {
		return x.a.storeFailed("get", err, nil)
	}
	if int64(n) > x.rt.settings.MaxResponseBody {
		return notReplayable(rec)
	}
	buf := getBody(n)
	if err := x.p.buffers.take(x.bufs.holder, cap(buf)); err != nil {
		putBody(buf)
		return bufferRefused(err, "the stored answer is kept")
	}
	x.bufs.inflated = buf // given back with the others
	if err := rec.Inflate(buf); err != nil {
		return x.a.storeFailed("get", err, nil)
	}
	return nil
}

// readBody reads the request body up to max_request_body; or the reply
// that refused it.
func (x *exchange) readBody() ([]byte, *reply) {
	limit := x.rt.settings.MaxRequestBody
	if x.r.ContentLength > limit {
		return nil, refuse(outcomeRejected, probBodyTooLarge.with(fmt.Sprintf("this route accepts at most %d bytes", limit)))
	}
	// A client trickling its body (slow loris) must not hold a handler
	// forever; the deadline covers only this read.
	rc := http.NewResponseController(x.w)
	_ = rc.SetReadDeadline(time.Now().Add(x.h.bodyTimeout))
	take := func(n int) error { return x.p.buffers.take(x.bufs.holder, n) }
	give := func(n int) { x.p.buffers.give(x.bufs.holder, n) }
	body, err := readAll(http.MaxBytesReader(x.w, x.r.Body, limit), x.r.ContentLength, take, give)
	x.bufs.reqBuf = body
	if errors.Is(err, errOverBudget) || errors.Is(err, errOverShare) {
		x.w.Header().Set("Connection", "close")
		return nil, bufferRefused(err, "nothing was claimed or forwarded")
	}
	if err != nil {
		// Close after answering: otherwise net/http reads the rest of the
		// body before writing the answer, and a stalled client never gets
		// one. The read deadline stays, so that read cannot hang either.
		x.w.Header().Set("Connection", "close")
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, refuse(outcomeRejected, probBodyTooLarge.with(fmt.Sprintf("this route accepts at most %d bytes", limit)))
		}
		return nil, refuse(outcomeRejected, probBodyUnreadable.with(err.Error()))
	}
	_ = rc.SetReadDeadline(time.Time{})
	return body, nil
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
	x.seen = &spanSink{t: x.h.tracing, ctx: x.r.Context(), span: x.span, store: x.p.store}
	if sc := x.span.SpanContext(); sc.IsValid() {
		x.trace = claim.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID()}
	}
	if sc := x.span.SpanContext(); sc.HasTraceID() {
		x.traceID = sc.TraceID().String()
	}
}

// endTrace ends the server span with the exchange's outcome.
func (x *exchange) endTrace() {
	if x.span == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("idemproxy.outcome", x.res.outcome),
		attribute.Bool("idemproxy.replayed", x.res.outcome == outcomeReplayed),
		semconv.HTTPResponseStatusCode(x.res.status),
	}
	if x.a != nil && x.a.hashedKey != "" {
		attrs = append(attrs, attribute.String("idemproxy.key", x.a.hashedKey))
	}
	if x.res.original != "" {
		attrs = append(attrs, attribute.String("idemproxy.original_request_id", x.res.original))
	}
	x.span.SetAttributes(attrs...)
	if res := x.res; res.status >= 500 || res.outcome == outcomeStoreError || res.outcome == outcomeFenceLost || res.outcome == outcomeStoreUnavailable || res.outcome == outcomeRecordUnreadable {
		// error.type (the HTTP conventions): the status from 500 on, else
		// the outcome that made it an error.
		errType := res.outcome
		if res.status >= 500 {
			errType = strconv.Itoa(res.status)
		}
		x.span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		x.span.SetStatus(codes.Error, res.outcome)
	}
	x.span.End()
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
