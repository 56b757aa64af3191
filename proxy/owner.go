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
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// owner is the state of a request that holds the claim, shared between
// the exchange and the ReverseProxy hooks through the request context.
type owner struct {
	x *exchange
	// held is the claim (the record it was claimed with, the
	// max_in_flight slot it is forwarded in), renewed and settled on the
	// attempt's side. The slot is given back once the client is answered
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

	// mu guards settledBy and serialises renewals with settling, so a
	// renewal never runs after the record was completed or released.
	mu sync.Mutex
	// settledBy is the reply the claim was settled with (settle); nil
	// while it is not settled.
	settledBy *reply
	renewer   *time.Timer
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
	// errClaimTooLate: the owner got to forwarding after its claim's
	// confirm window (a slow store, a paused process); it must not
	// forward, since the next attempt may take the claim for never
	// forwarded, or its lease may have lapsed.
	errClaimTooLate = errors.New("the claim was confirmed too late to forward")
)

// own forwards the request as the claim's owner and settles the claim.
func (x *exchange) own(held *holding, body []byte) {
	h := x.h
	g := newGate(x.w)
	x.w = g // every answer of the owner goes through the gate
	defer g.seal()
	o := &owner{x: x, held: held, body: body, gate: g}
	lease := x.rt.settings.Lease
	o.renewer = time.AfterFunc(lease/3, o.renew)
	defer o.settle(nil) // stops renewal if nothing settled (a panic)

	// The upstream call is detached from the client: if the client hangs
	// up, the upstream still finishes and its answer is stored, so the
	// client's retry gets a replay instead of a second execution. It may
	// run past upstream.timeout, which bounds only the client's wait, for
	// upstream.late_answer_window more.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(x.r.Context()))
	defer cancel(nil)
	o.cancel = cancel
	budget, cause := h.upstreamTimeout, error(nil)
	if h.lateWindow > 0 {
		budget, cause = h.upstreamTimeout+h.lateWindow, errLateWindow
		client := time.AfterFunc(h.upstreamTimeout, o.clientTimedOut)
		defer client.Stop()
	}
	ctx, stop := context.WithTimeoutCause(ctx, budget, cause)
	defer stop()
	h.owners.add(&o.cancel)
	defer h.owners.remove(&o.cancel)
	if h.abandoned.Load() {
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
	// A streamed answer's pump outlives the copy to the client (a client
	// that went away, which unwinds ServeHTTP): the call's context stays
	// until the stream ended and was recorded.
	defer o.waitStream()
	x.fwd.protected.ServeHTTP(g, out)
	o.waitStream()
	status, closed := g.seal()
	if x.status == 0 || status != 0 {
		x.status = status
	}
	if closed { // the client got 504: this was a late call, holding a slot
		x.status = http.StatusGatewayTimeout
		h.late.give(x.a.principal)
		h.metrics.lateCalls.Dec()
		o.lateSettled()
	}
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
	if ok, refused := h.late.take(x.a.principal); !ok {
		h.metrics.lateRefused.WithLabelValues(x.rt.name, refused).Inc()
		x.log().Warn("late call refused: upstream call cancelled at upstream.timeout, unknown_outcome applies",
			"route", x.rt.name, "reason", refused, "key", x.a.hashedKey, "request_id", x.requestID)
		o.cancel(errLateCap)
		return
	}
	p := probUpstreamTimeout.with(fmt.Sprintf("no answer within %s; the request is still running upstream and its answer will be stored: retry with the same key to get it", h.upstreamTimeout))
	p.retryAfter = x.rt.settings.Lease
	answered := o.gate.close(func(w http.ResponseWriter) {
		h.metrics.lateCalls.Inc()
		w.Header().Set("Connection", "close") // this handler stays busy
		h.problems.write(w, p, x.requestID, x.rt.settings.Problems)
	})
	if !answered { // the answer is already on its way
		h.late.give(x.a.principal)
		return
	}
	x.answeredTimeout(p.Detail)
	// The client has its answer: from here the late-call pool bounds this
	// call, and its max_in_flight slot is free for another first attempt.
	o.held.slot.give()
}

// lateSettled counts and logs how a late call ended.
func (o *owner) lateSettled() {
	x := o.x
	result := lateAbandoned
	switch {
	case x.outcome == outcomeStored && x.unknown == "":
		result = lateStored
	case x.outcome == outcomeReleased && x.unknown == "":
		result = lateReleased
	case (x.outcome == outcomeStoreError || x.outcome == outcomeFenceLost) && x.unknown == "":
		result = lateUnstored
	}
	x.late = true
	x.h.metrics.lateAnswers.WithLabelValues(x.rt.name, result).Inc()
	level := slog.LevelInfo
	if result != lateStored && result != lateReleased {
		level = slog.LevelWarn
	}
	x.log().Log(context.Background(), level, "late answer", "route", x.rt.name, "result", result,
		"key", x.a.hashedKey, "request_id", x.requestID, "upstream", time.Since(o.sent), "outcome", x.outcome)
	if x.span != nil && x.h.tracing != nil {
		// A second event, linked to the request's span, which ended when
		// its client was answered 504.
		_, sp := x.h.tracing.tracer.Start(context.Background(), "late answer",
			trace.WithLinks(trace.Link{SpanContext: x.span.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("idemproxy.link", "timed_out_request")}}),
			trace.WithTimestamp(o.sent),
			trace.WithAttributes(
				attribute.String("idemproxy.route", x.rt.name),
				attribute.String("idemproxy.late_result", result),
				attribute.String("idemproxy.outcome", x.outcome),
				attribute.String("idemproxy.key", x.a.hashedKey),
			))
		if result != lateStored && result != lateReleased {
			sp.SetStatus(codes.Error, result)
		}
		sp.End()
	}
}

// renew extends the lease every lease/3 while the upstream runs.
func (o *owner) renew() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.settledBy != nil {
		return
	}
	if o.held.renew() {
		o.renewer.Reset(o.x.rt.settings.Lease / 3)
	}
}

// renew extends the claim's lease by one lease, counted and logged; it returns whether renewing again may
// help (false once the lease was lost to another attempt).
func (c *holding) renew() bool {
	a, held := c.a, c.rec
	lease := a.rt.settings.Lease
	ctx, cancel := context.WithTimeout(context.Background(), lease/3)
	defer cancel()
	err := a.storeOp(ctx, "renew", func(ctx context.Context) error { return a.h.store.Renew(ctx, a.hashedKey, held, lease) })
	switch {
	case err == nil:
		a.h.metrics.renewals.WithLabelValues("ok").Inc()
	case errors.Is(err, claim.ErrLeaseLost):
		// Keep forwarding: the upstream call is under way and cannot be
		// taken back. Completion is fenced and will say what happened.
		a.h.metrics.renewals.WithLabelValues("lost").Inc()
		a.log().Error("lease lost while the upstream runs", "route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID)
		return false
	default:
		a.h.metrics.renewals.WithLabelValues("error").Inc()
		a.h.storeError("renew")
		a.log().Warn("lease renewal failed", "route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID, "err", err)
	}
	return true
}

// answeredTimeout records the request when its client is answered 504 at
// upstream.timeout, while the upstream call goes on (a late call): counted
// as upstream_timeout, logged and its span ended now, not when the late
// answer settles minutes later; the settlement is its own event
// (owner.lateSettled: a "late answer" line, idemproxy_late_answers_total
// and a span linked to this one). It runs on the timer's goroutine beside
// the handler's, so it reads only what is fixed once the request was
// forwarded.
func (x *exchange) answeredTimeout(detail string) {
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
		return o.x.lend(o.body)
	}
	o.copied = io.NopCloser(bytes.NewReader(bytes.Clone(o.body)))
	return o.copied
}
