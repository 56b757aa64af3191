package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// exchange is one protected request on its way through the protocol: the
// writer and the request, admission, respond, finishing and tracing. The
// protocol on its key is its attempt's.
type exchange struct {
	// front is what the exchange knows before its request is admitted:
	// the handler, the route, the request's id, start and trace.
	front
	// a is the protocol on the request's key: claiming, answering from a
	// record, waiting; nil until the request is admitted, then built
	// whole from the front and what admission found. The exchange holds
	// it, never embeds it, so that what is HTTP (the exchange's methods)
	// and what is the protocol (x.a's) read apart.
	a    *attempt
	fwd  *forwarder
	w    http.ResponseWriter
	r    *http.Request
	path string
	// trusted says whether the peer is a trusted proxy.
	trusted bool

	// outcome and status are what finish counts and logs.
	outcome string
	status  int
	detail  string
	// upstream is how long the upstream took, zero when not forwarded.
	upstream time.Duration
	// original is the request id of the attempt a replay answers with.
	original string
	// unknown, when set, says why the upstream's outcome is unknown.
	unknown string
	// late is set when the client was answered 504 while the upstream
	// call went on past upstream.timeout.
	late bool
	// timedOut is set once the client's 504 was counted, logged and
	// traced (answeredTimeout): finish then has nothing left to record.
	timedOut atomic.Bool
	// span is the request's server span; nil when tracing is off.
	span trace.Span
	// webhookResult, when set, is the delivery's result label (webhook.go)
	// where the outcome does not say it.
	webhookResult string

	// loans are the pooled buffers the request's body and the answer
	// were read into, and the bodies lent over them (pool.go).
	loans
}

// admitted is what a route's admission let through.
type admitted struct {
	admittedAs
	body []byte
	// legacy, on a webhook route, are the keys earlier releases stored
	// the delivery under (useLegacyKey).
	legacy []legacyKey
}

// serve runs steps 2 to 8 of the request flow (route match is done): the
// route's admission (admitClient: the forwarded identity and the key; or
// admitDelivery: a webhook delivery's signature), which reads the body,
// then one tail: fingerprint the request, claim the key and either own
// the request or answer from the record already there. What a step
// decides is written once, by respond.
func (x *exchange) serve() {
	x.respond(x.decide())
}

// decide is serve's steps: the reply they decided, nil when the owner
// answered with the upstream's.
func (x *exchange) decide() *reply {
	// The route's admission: a webhook delivery's signature, or the
	// client's identity and key. It is the exchange's, the HTTP front's
	// (the route holds none): another front admits its own way.
	admit := x.admitClient
	if x.rt.settings.Webhook != nil {
		admit = x.admitDelivery
	}
	in, rep := admit()
	if rep != nil {
		return rep
	}
	fp := x.rt.fp.sum(x.r.Method, x.path, x.r.URL.RawQuery, x.r.Header, in.body)
	x.a = x.front.newAttempt(in.admittedAs)
	if len(in.legacy) > 0 {
		if rep := x.a.useLegacyKey(in.legacy); rep != nil {
			return rep
		}
	}
	rec := x.a.newClaim(fp)
	held, rep := x.a.ownOrAnswer(rec, in.body, x.authorize)
	if held == nil {
		return rep
	}
	defer held.slot.give()
	x.own(held, in.body)
	return nil
}

// admitClient is the admission of a route whose principals come from
// identity (header, JWT or XFCC): the key, the principal, the body, a key
// in the body, and a first-sent time; or the reply that refused it.
func (x *exchange) admitClient() (admitted, *reply) {
	key, rep := x.admit()
	if rep != nil {
		return admitted{}, rep
	}
	body, rep := x.readBody()
	if rep != nil {
		return admitted{}, rep
	}
	if x.rt.keyPointer != nil {
		if key, rep = x.keyInBody(key, body); rep != nil {
			return admitted{}, rep
		}
	}
	in := admitted{admittedAs: admittedAs{principal: x.holder, key: key}, body: body}
	if rep := x.readFirstSent(&in.admittedAs); rep != nil {
		return admitted{}, rep
	}
	return in, nil
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
	if err := x.h.buffers.take(x.holder, cap(buf)); err != nil {
		putBody(buf)
		return bufferRefused(err, "the stored answer is kept")
	}
	x.inflated = buf // given back with the others
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
	take := func(n int) error { return x.h.buffers.take(x.holder, n) }
	give := func(n int) { x.h.buffers.give(x.holder, n) }
	body, err := readAll(http.MaxBytesReader(x.w, x.r.Body, limit), x.r.ContentLength, take, give)
	x.reqBuf = body
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

// finish counts and logs the request once.
func (x *exchange) finish() {
	if x.timedOut.Load() {
		return // recorded when the client was answered (answeredTimeout)
	}
	if x.outcome == "" {
		x.outcome = outcomeRejected // aborted before an answer was chosen
	}
	defer x.endTrace()
	total := time.Since(x.start)
	x.h.metrics.requests.WithLabelValues(x.rt.name, x.outcome).Inc()
	if x.rt.settings.Webhook != nil {
		x.h.metrics.webhooks.WithLabelValues(x.rt.name, x.webhookOutcome()).Inc()
	}
	x.h.metrics.added.WithLabelValues(x.rt.name).Observe((total - x.upstream).Seconds())
	level := slog.LevelInfo
	switch x.outcome {
	case outcomeStoreError, outcomeFenceLost, outcomeRecordUnreadable:
		level = slog.LevelError
	case outcomeStoreUnavailable:
		level = slog.LevelWarn
	}
	if !x.log().Enabled(context.Background(), level) {
		return // log_level above this line's: skip building it
	}
	line := requestLine{
		route: x.rt.name, outcome: x.outcome, status: x.status, requestID: x.requestID,
		duration: total, upstream: x.upstream, original: x.original,
		late: x.late, detail: x.detail, traceID: x.traceID,
	}
	if x.a != nil { // refused or bypassed before it had a key: none is logged
		line.key = x.a.hashedKey
	}
	line.log(x.h.log, level)
}
