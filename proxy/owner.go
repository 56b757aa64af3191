package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// owner is the HTTP front's side of a request that holds the claim: the
// ReverseProxy hooks' state, shared between the exchange and the hooks
// through the request context. The claim itself, its renewals and its
// settlement, are the holding's (settle.go, fail.go).
type owner struct {
	x *exchange
	// held is the claim (the record it was claimed with, the
	// max_in_flight slot it is forwarded in), renewed and settled on the
	// protocol's side. The slot is given back once the client is answered
	// (a late call) or the call ends.
	held *holding
	body []byte
	// copied is the forwarded copy of a small body (forwardBody), nil for
	// a lent one.
	copied io.ReadCloser
	// wrote is set once request bytes may have reached the upstream (its
	// headers were written), for the current attempt.
	wrote atomic.Bool
	// sent is when the request was forwarded, for the upstream histogram.
	sent time.Time
	// gate carries the answer to the client; the late-answer timer may
	// close it.
	gate *gate
	// stream, once the answer is a stream relayed as it arrives, is its
	// pump (pump.go); set on the handler's goroutine.
	stream *streamPump
	// cancel ends the upstream call with a cause: the late-call cap, or a
	// drain that ran out of time.
	cancel context.CancelCauseFunc

	// What the call brought, for the request's result: written on the
	// handler's goroutine (the hooks run on it), read by result once the
	// call is over. upstream is how long the upstream took; status its
	// answer's; answered the status the gate let through; closed says the
	// client got 504 at upstream.timeout (a late call); unknown why the
	// outcome is unknown, when it is; late that a late call settled.
	upstream time.Duration
	status   int
	answered int
	closed   bool
	unknown  string
	late     bool
}

type ownerKey struct{}

func ownerFrom(ctx context.Context) *owner {
	o, _ := ctx.Value(ownerKey{}).(*owner)
	return o
}

// Causes that end an owner's upstream call early; errorHandler names them.
var (
	errLateCap    = errors.New("upstream.max_late_calls reached: cancelled at upstream.timeout")
	errLateWindow = errors.New("no answer within upstream.timeout + upstream.late_answer_window")
	errAbandoned  = errors.New("drain.timeout ran out at shutdown: cancelled")
)

// own forwards the request as the claim's owner, and the claim settles
// on the protocol's side by what the call brought.
func (x *exchange) own(held *holding, body []byte) {
	p := x.p
	g := newGate(x.w)
	x.w = g // every answer of the owner goes through the gate
	defer g.seal()
	o := &owner{x: x, held: held, body: body, gate: g}
	held.keepAlive()
	defer held.settle(nil) // stops renewal if nothing settled (a panic)

	// The upstream call is detached from the client: if the client hangs
	// up, the upstream still finishes and its answer is stored, so the
	// client's retry gets a replay instead of a second execution. It may
	// run past upstream.timeout, which bounds only the client's wait, for
	// upstream.late_answer_window more.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(x.r.Context()))
	defer cancel(nil)
	o.cancel = cancel
	budget, cause := p.upstreamTimeout, error(nil)
	if p.lateWindow > 0 {
		budget, cause = p.upstreamTimeout+p.lateWindow, errLateWindow
		client := time.AfterFunc(p.upstreamTimeout, o.clientTimedOut)
		defer client.Stop()
	}
	ctx, stop := context.WithTimeoutCause(ctx, budget, cause)
	defer stop()
	p.owners.add(&o.cancel)
	defer p.owners.remove(&o.cancel)
	if p.abandoned.Load() {
		cancel(errAbandoned) // a drain gave up before this call began
	}
	ctx = context.WithValue(ctx, ownerKey{}, o)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { o.wrote.Store(true) },
	})
	// A shallow copy is enough: ReverseProxy deep-clones it for the
	// outbound request.
	out := x.r.WithContext(ctx)
	out.Trailer = nil // request trailers never reach the upstream of a protected route
	out.Body = o.forwardBody()
	out.ContentLength = int64(len(body))
	o.sent = time.Now()
	// What the call brought is noted once it is over, a panic included
	// (a client gone mid-answer unwinds ServeHTTP).
	defer func() { x.note(o.result()) }()
	// A streamed answer's pump outlives the copy to the client (a client
	// that went away, which unwinds ServeHTTP): the call's context stays
	// until the stream ended and was recorded.
	defer o.waitStream()
	x.fwd.protected.ServeHTTP(g, out)
	o.waitStream()
	o.answered, o.closed = g.seal()
	if o.closed { // the client got 504: this was a late call, holding a slot
		p.late.give(x.a.principal)
		p.metrics.lateCalls.Dec()
		o.lateSettled()
	}
}

// result is what the call brought, for the request's result: the
// upstream's time and status (or the status the gate let through, 504
// for a late call), and how a streamed answer ended.
func (o *owner) result() result {
	r := result{upstream: o.upstream, status: o.status, late: o.late}
	if o.answered != 0 {
		r.status = o.answered
	}
	if o.closed {
		r.status = http.StatusGatewayTimeout
	}
	if o.stream != nil {
		r.detail = o.stream.wait().detail
	}
	return r
}

// unknownWhy is why the call's outcome is unknown, when it is: the call
// failed after it was sent, or its stream broke off.
func (o *owner) unknownWhy() string {
	if o.stream != nil {
		if why := o.stream.wait().unknown; why != "" {
			return why
		}
	}
	return o.unknown
}

// waitStream returns once a streamed answer, if any, ended and was
// recorded.
func (o *owner) waitStream() {
	if o.stream != nil {
		o.stream.wait()
	}
}

// clientTimedOut runs at upstream.timeout, on the timer's goroutine, while
// the upstream call goes on. It answers the client 504 and keeps the call
// running for its late answer, when a late-call slot is free; otherwise it
// cancels the call, whose outcome is then unknown.
func (o *owner) clientTimedOut() {
	x, h := o.x, o.x.h
	if ok, refused := h.p.late.take(x.a.principal); !ok {
		h.metrics.lateRefused.WithLabelValues(x.rt.name, refused).Inc()
		x.log().Warn("late call refused: upstream call cancelled at upstream.timeout, unknown_outcome applies",
			"route", x.rt.name, "reason", refused, "key", x.a.hashedKey, "request_id", x.requestID)
		o.cancel(errLateCap)
		return
	}
	p := probUpstreamTimeout.with(fmt.Sprintf("no answer within %s; the request is still running upstream and its answer will be stored: retry with the same key to get it", h.p.upstreamTimeout))
	p.retryAfter = x.rt.settings.Lease
	answered := o.gate.close(func(w http.ResponseWriter) {
		h.metrics.lateCalls.Inc()
		w.Header().Set("Connection", "close") // this handler stays busy
		writeFramed(w, x.rt.front.frame(p, x.requestID))
	})
	if !answered { // the answer is already on its way
		h.p.late.give(x.a.principal)
		return
	}
	o.answeredTimeout(p.Detail)
	// The client has its answer: from here the late-call pool bounds this
	// call, and its max_in_flight slot is free for another first attempt.
	o.held.slot.give()
}

// lateSettled counts and logs how a late call ended.
func (o *owner) lateSettled() {
	x := o.x
	outcome, unknown := x.res.outcome, o.unknownWhy()
	result := lateAbandoned
	switch {
	case outcome == outcomeStored && unknown == "":
		result = lateStored
	case outcome == outcomeReleased && unknown == "":
		result = lateReleased
	case (outcome == outcomeStoreError || outcome == outcomeFenceLost) && unknown == "":
		result = lateUnstored
	}
	o.late = true
	x.h.metrics.lateAnswers.WithLabelValues(x.rt.name, result).Inc()
	level := slog.LevelInfo
	if result != lateStored && result != lateReleased {
		level = slog.LevelWarn
	}
	x.log().Log(context.Background(), level, "late answer", "route", x.rt.name, "result", result,
		"key", x.a.hashedKey, "request_id", x.requestID, "upstream", time.Since(o.sent), "outcome", outcome)
	if x.span != nil && x.h.tracing != nil {
		// A second event, linked to the request's span, which ended when
		// its client was answered 504.
		_, sp := x.h.tracing.tracer.Start(context.Background(), "late answer",
			trace.WithLinks(trace.Link{SpanContext: x.span.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("idemproxy.link", "timed_out_request")}}),
			trace.WithTimestamp(o.sent),
			trace.WithAttributes(
				attribute.String("idemproxy.route", x.rt.name),
				attribute.String("idemproxy.late_result", result),
				attribute.String("idemproxy.outcome", outcome),
				attribute.String("idemproxy.key", x.a.hashedKey),
			))
		if result != lateStored && result != lateReleased {
			sp.SetStatus(codes.Error, result)
		}
		sp.End()
	}
}

// answeredTimeout records the request when its client is answered 504 at
// upstream.timeout, while the upstream call goes on (a late call): counted
// as upstream_timeout, logged and its span ended now, not when the late
// answer settles minutes later; the settlement is its own event
// (owner.lateSettled: a "late answer" line, idemproxy_late_answers_total
// and a span linked to this one). It runs on the timer's goroutine beside
// the handler's, so it reads only what is fixed once the request was
// forwarded.
func (o *owner) answeredTimeout(detail string) {
	x := o.x
	total := time.Since(x.start)
	x.h.metrics.requests.WithLabelValues(x.rt.name, outcomeUpstreamTimeout).Inc()
	line := requestLine{route: x.rt.name, outcome: outcomeUpstreamTimeout, status: http.StatusGatewayTimeout,
		requestID: x.requestID, duration: total, key: x.a.hashedKey, detail: detail, traceID: x.traceID}
	if x.h.log.Enabled(context.Background(), slog.LevelInfo) {
		line.log(x.h.log, slog.LevelInfo)
	}
	if x.span != nil {
		x.span.SetAttributes(
			attribute.String("idemproxy.outcome", outcomeUpstreamTimeout),
			semconv.HTTPResponseStatusCode(http.StatusGatewayTimeout),
			semconv.ErrorTypeKey.String("504"),
			attribute.String("idemproxy.key", x.a.hashedKey),
		)
		x.span.SetStatus(codes.Error, outcomeUpstreamTimeout)
		x.span.End()
	}
	x.timedOut.Store(true)
}

// forwardBody is the body of the owner's request to the upstream. A small
// one is a copy the garbage collector owns, in a reader http.Transport
// knows to be in memory (rewrite unwraps it from ReverseProxy's wrapper),
// so that the headers and the body go out in one system call; any other
// reader has the headers flushed first, one write more per first attempt
// (about 6 µs of CPU). The copy is never reused, so a write loop that
// outlives RoundTrip reads nothing another request owns. Larger ones are
// lent (lend). Either is a non-nil reader that is not http.NoBody, and
// GetBody stays nil, so the transport never resends the request
// (Request.isReplayable).
func (o *owner) forwardBody() io.ReadCloser {
	if len(o.body) == 0 || len(o.body) > smallForward {
		o.copied = nil
		return o.x.bufs.lend(o.body)
	}
	o.copied = io.NopCloser(bytes.NewReader(bytes.Clone(o.body)))
	return o.copied
}

// upstreamSpan starts the client span of an upstream call and puts its
// traceparent on req, which is the outgoing request ReverseProxy built.
func (o *owner) upstreamSpan(req *http.Request) (*http.Request, trace.Span) {
	defaultPort := "80"
	if req.URL.Scheme == "https" {
		defaultPort = "443"
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(req.Method),
		semconv.URLFull(redactedURL(req.URL)),
	}
	attrs = append(attrs, hostPort(req.URL.Host, defaultPort)...)
	ctx, sp := o.x.h.tracing.tracer.Start(req.Context(), req.Method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrs...))
	o.x.h.tracing.propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req.WithContext(ctx), sp
}
