package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// exchange is one protected request on its way through the protocol.
type exchange struct {
	h         *Handler
	fwd       *forwarder
	rt        *route
	w         http.ResponseWriter
	r         *http.Request
	path      string
	principal string
	// trusted says whether the peer is a trusted proxy.
	trusted   bool
	requestID string
	start     time.Time

	// hashedKey is the Redis key, the only form of the key that is logged.
	hashedKey string
	// idemKey is the idempotency key as the client sent it: never logged,
	// only sent to the upstream (a reconcile lookup).
	idemKey string
	// claimSetAt is when this attempt's claim ran on Redis' clock, as the
	// claim's own round trip read it; zero when not read.
	claimSetAt time.Time
	// reconcileResult is the last reconcile lookup's result; empty when
	// none was made.
	reconcileResult string
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
	// firstSent is when the request was first sent, when hasFirstSent
	// (firstsent.go).
	firstSent    time.Time
	hasFirstSent bool
	// forwardBy is when the current claim stops being one its owner may
	// act on (claim.ConfirmWindow after it was sent): nothing is forwarded
	// after it.
	forwardBy time.Time

	// reqBuf and respBuf are the pooled buffers the request's body and
	// the upstream's answer were read into; lent are the bodies handed out
	// over them (the forwarded body, a resend, the answer), more those
	// beyond three. giveBack takes all of them back. Only the handler's
	// goroutine lends: ReverseProxy calls its hooks and Transport in it.
	reqBuf, respBuf []byte
	// inflated holds a stored body inflated for its replay.
	inflated []byte
	lent     [3]lentBody
	nlent    int
	more     []*lentBody
}

// admitted is what a route's admission let through.
type admitted struct {
	key  string
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
	in, rep := x.rt.admit(x)
	if rep != nil {
		return rep
	}
	fp := x.rt.fp.sum(x.r.Method, x.path, x.r.URL.RawQuery, x.r.Header, in.body)
	x.hashedKey, x.idemKey = x.h.codec.Key(x.principal, x.rt.scope, in.key), in.key
	if len(in.legacy) > 0 {
		if rep := x.useLegacyKey(in.legacy); rep != nil {
			return rep
		}
	}
	return x.ownOrAnswer(x.newClaim(fp), in.body)
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
	if rep := x.readFirstSent(key); rep != nil {
		return admitted{}, rep
	}
	return admitted{key: key, body: body}, nil
}

// newClaim is the in-progress record this attempt claims the key with.
func (x *exchange) newClaim(fp claim.Fingerprint) *claim.Record {
	rec := &claim.Record{
		State:       claim.InProgress,
		Fingerprint: fp,
		Created:     time.Now(),
		RequestID:   x.requestID,
		Trace:       x.traceContext(),
		// A request that says when it was first sent learns of a store
		// that lost its data in its own claim's round trip.
		ReadEpoch: x.hasFirstSent,
	}
	_, _ = io.ReadFull(x.h.rand, rec.Token[:])
	if x.rt.settings.Unknown == Fail || x.rt.settings.Reconcile != nil {
		// The claim outlives its lease, so that an owner that vanishes
		// leaves an orphan the next attempt settles (or asks the upstream
		// about, on a reconcile route), not a free key.
		rec.Tail = x.rt.settings.Retention
	}
	return rec
}

// ownOrAnswer claims the key with rec and forwards as its owner, or
// answers from the record already there: waiting for a first attempt in
// progress (concurrent: wait), settling an orphan, or replaying, 409 or
// 422. A key freed while waiting, or an orphan that changed under us, is
// claimed again. It returns the reply decided, nil when it owned the
// request (the owner answered).
func (x *exchange) ownOrAnswer(rec *claim.Record, body []byte) *reply {
	s := &x.rt.settings
	var waitUntil time.Time
	if s.Wait {
		waitUntil = x.start.Add(s.MaxWait)
	}
	for attempt := 0; ; attempt++ {
		res, err := x.claim(rec)
		if errors.Is(err, claim.ErrLeaseLost) && attempt < maxOrphanSettles {
			// Made, then freed before it was confirmed (redisstore.Store.Claim):
			// claim again, under a new token, so that nothing fenced on
			// the freed claim's token can touch the new one.
			_, _ = io.ReadFull(x.h.rand, rec.Token[:])
			continue
		}
		if err != nil {
			return x.storeFailed("claim", err, body)
		}
		if res.Renewed {
			x.log().Warn("claim renewed before forwarding: its SET ran, on Redis' clock, too long after this sidecar sent it for a retry not to take it for never forwarded (a clock off or stepped, on Redis' host or this one); claims are written unmarked until the clocks are measured close again",
				"route", x.rt.name, "key", x.hashedKey, "request_id", x.requestID)
		}
		if res.Claimed {
			x.claimSetAt = res.SetAt()
			if rep := x.refuseUnrecorded(rec); rep != nil {
				return rep
			}
			slot, refused := x.h.forwarding.take(x.rt.name, x.principal, x.rt.settings.MaxInFlight, x.rt.settings.MaxInFlightShare)
			if slot == nil {
				return x.shed(rec, refused)
			}
			defer slot.give()
			x.own(rec, body, slot)
			return nil
		}
		if res.Unforwarded && attempt < maxOrphanSettles {
			// A claim that was never confirmed in time: its owner never
			// forwarded and never will. Nothing happened; free it.
			if rep := x.clearUnforwarded(res.Existing); rep != nil {
				return rep
			}
			continue
		}
		if attempt == 0 {
			if rep := x.authorize(); rep != nil {
				return rep // the caller may no longer learn anything about this key
			}
		}
		existing, ttl := res.Existing, res.TTL
		if existing.State == claim.InProgress && x.h.codec.SameRequest(existing, rec.Fingerprint) && !existing.Orphaned(ttl) && time.Now().Before(waitUntil) {
			existing, ttl, err = x.wait(waitUntil)
			if err != nil {
				return x.storeFailed("get", err, nil)
			}
			if existing == nil {
				continue // released or lapsed: claim it ourselves
			}
		}
		if rep := x.ownerAlive(existing, rec, ttl); rep != nil {
			return rep
		}
		if since, ok := x.reconcilable(existing, rec, ttl); ok && attempt < maxOrphanSettles {
			if rep := x.reconcileExisting(existing, rec, since); rep != nil {
				return rep
			}
			continue // freed, or changed under us: claim again
		}
		if x.h.codec.SameRequest(existing, rec.Fingerprint) && existing.Orphaned(ttl) && attempt < maxOrphanSettles {
			if rep := x.settleOrphan(existing); rep != nil {
				return rep
			}
			continue // the key changed under us: look again
		}
		return x.answerExisting(existing, rec.Fingerprint, ttl)
	}
}

// ownerAlive notes existing, a claim in progress for the same request,
// on this sidecar's own clock, and answers the route's in-progress status
// while it looks orphaned but its owner has not yet been seen without a
// sign of life for a full lease (liveness.go): a step of the store's
// clock lowers a live owner's TTL as much as its death does. It returns
// nil when existing may be acted on as it is: not orphaned, or its owner
// gone.
func (x *exchange) ownerAlive(existing, rec *claim.Record, ttl time.Duration) *reply {
	if existing.State != claim.InProgress || !x.h.codec.SameRequest(existing, rec.Fingerprint) {
		return nil
	}
	gone, wait := x.h.liveness.see(x.hashedKey, existing, max(x.rt.settings.Lease, existing.Lease))
	if gone || !existing.Orphaned(ttl) {
		return nil
	}
	return x.inProgress("retry after the time in Retry-After; the first attempt's owner has not renewed its lease lately, and is taken for gone only once this sidecar has seen no sign of it for a whole lease", wait)
}

// shed answers a request whose route forwards max_in_flight first attempts
// already: its claim is released (nothing was forwarded, so a retry
// really retries) and the client told when to come back.
func (x *exchange) shed(rec *claim.Record, refused string) *reply {
	err := x.detached("release", func(ctx context.Context) error { return x.h.store.Release(ctx, x.hashedKey, rec.Token) })
	detail := "the route forwards max_in_flight requests already; nothing was forwarded and the key is free, retry later"
	if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
		// Nothing was forwarded: the claim is one the next attempt may
		// take as never forwarded, once its confirm window is over.
		x.h.metrics.storeErrors.WithLabelValues("release").Inc()
		detail = "the route forwards max_in_flight requests already; nothing was forwarded, retry later"
	}
	if refused != refusedCap {
		detail = "this principal holds its share of the route's max_in_flight (the rest is kept for others); nothing was forwarded, retry later"
	}
	x.h.metrics.overloaded.WithLabelValues(x.rt.name, refused).Inc()
	p := probOverloaded.with(detail)
	p.retryAfter = time.Second
	return refuse(outcomeRejected, p)
}

// maxOrphanSettles bounds how often one request tries to settle an
// orphaned claim that keeps changing under it.
const maxOrphanSettles = 3

// settleOrphan settles a claim whose owner vanished (unknown_outcome:
// fail) as outcome-unknown, and answers with it: the request may have
// executed, so this attempt must not. It returns nil, having decided
// nothing, when the key changed first.
func (x *exchange) settleOrphan(orphan *claim.Record) *reply {
	x.linkTo(orphan)
	rec := x.h.outcomeUnknownRecord(orphan, claim.Token{}, time.Now(), true, x.rt.settings.Problems, false, time.Time{})
	_, _ = io.ReadFull(x.h.rand, rec.Token[:])
	err := x.detached("complete", func(ctx context.Context) error {
		return x.h.store.SettleOrphan(ctx, x.hashedKey, orphan, rec, x.rt.settings.Retention)
	})
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		return nil
	case err != nil:
		return x.storeFailed("complete", err, nil)
	}
	x.h.liveness.forget(x.hashedKey)
	x.h.metrics.unknownOutcomes.WithLabelValues(x.rt.name, unknownOrphan).Inc()
	return x.replay(rec).withDetail("the claim's owner vanished without settling (lease lapsed): settled as 502 outcome-unknown")
}

// claim runs the one-round-trip claim-or-read, timed. The record's
// Created time is now, and the claim must be confirmed within
// claim.ConfirmWindow of it: an owner forwards only then (forwardBy), so a
// claim whose SET runs later can be told never forwarded by the next
// attempt. A claim whose reply did not come may still land: it is cleaned
// up in the background.
func (x *exchange) claim(rec *claim.Record) (claim.Result, error) {
	s := &x.rt.settings
	rec.Created = time.Now()
	x.forwardBy = rec.Created.Add(claim.ConfirmWindow(s.Lease))
	var q claim.Quota
	if s.QuotaNewKeys > 0 {
		q = claim.Quota{Key: x.h.codec.QuotaKey(x.principal, x.rt.scope), Limit: s.QuotaNewKeys, Window: s.QuotaWindow}
	}
	// Not the request's context: a client that hangs up cannot unsend a
	// SET already written, and cancelling it would only turn a claim
	// into one to clean up, work a client could cause for free.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(x.r.Context()), x.forwardBy)
	defer cancel()
	var res claim.Result
	err := x.storeOp(ctx, "claim", func(ctx context.Context) (err error) {
		res, err = x.h.store.Claim(ctx, x.hashedKey, rec, s.Lease, q)
		return err
	})
	if err != nil && mayHaveWritten(err) {
		x.h.unconfirmed.add(x.rt.name, x.hashedKey, rec.Token, rec.Created.Add(s.Lease+rec.Tail), claim.StillSending(err))
	}
	return res, err
}

// clearUnforwarded frees a claim its owner never forwarded (res.Existing,
// found with res.Unforwarded), so this attempt can claim the key. It
// returns the reply when the store failed, nil to claim again.
func (x *exchange) clearUnforwarded(ghost *claim.Record) *reply {
	err := x.detached("release", func(ctx context.Context) error { return x.h.store.ReleaseUnforwarded(ctx, x.hashedKey, ghost) })
	switch {
	case err == nil:
		x.h.metrics.unconfirmed.WithLabelValues(unconfirmedOnRetry).Inc()
		x.log().Info("unconfirmed claim", "route", x.rt.name, "key", x.hashedKey, "result", unconfirmedOnRetry,
			"original_request_id", ghost.RequestID, "request_id", x.requestID)
		return nil
	case errors.Is(err, claim.ErrLeaseLost):
		return nil // it changed under us: look again
	}
	return x.storeFailed("release", err, nil)
}

// answerExisting answers from a record another attempt wrote.
func (x *exchange) answerExisting(rec *claim.Record, fp claim.Fingerprint, ttl time.Duration) *reply {
	x.linkTo(rec)
	switch {
	case !x.h.codec.SameRequest(rec, fp):
		return refuse(outcomeMismatch, probMismatch.with("this idempotency key was first used with a different method, path, query, body or fingerprinted header"))
	case rec.State == claim.InProgress:
		return x.inProgress("retry after the time in Retry-After; the first attempt is still running", ttl)
	case rec.State == claim.Streamed:
		return x.attach(rec)
	case rec.BodyOmitted:
		return notReplayable(rec)
	}
	return x.replay(rec)
}

// inProgress answers a retry while the key's first attempt (or a lookup
// about it) runs: the route's in_progress_status (409, or 429 / 503, what
// generic retrying clients retry) with Retry-After.
func (x *exchange) inProgress(detail string, retryAfter time.Duration) *reply {
	p := probInProgress.with(detail)
	if st := x.rt.settings.InProgressStatus; st != 0 {
		p.Status = st
	}
	p.retryAfter = retryAfter
	return refuse(outcomeConflict, p)
}

// notReplayable answers a retry of a key whose first attempt was executed
// with an answer too large to store (or to replay) on this route.
func notReplayable(rec *claim.Record) *reply {
	p := probNotReplayable.with(fmt.Sprintf("the first attempt was executed and answered %d, with a body larger than this route's max_response_body", rec.Status))
	p.OriginalStatus = rec.Status
	return refuse(outcomeConflict, p)
}

// replay is the stored response, byte for byte, marked as a replay.
func (x *exchange) replay(rec *claim.Record) *reply {
	if rec.BodyCompressed {
		if rep := x.inflate(rec); rep != nil {
			return rep
		}
	}
	return replayOf(rec, outcomeReplayed)
}

// inflate decompresses a stored body for its replay into a buffer of the
// length its frame declares, held in the buffer budget as an upstream's
// answer is, and never longer than the route's max_response_body (a
// record planted in Redis can declare anything: one larger than the route
// stores is not replayable here). It returns the reply when it cannot.
func (x *exchange) inflate(rec *claim.Record) *reply {
	n, err := rec.InflatedLen()
	if err != nil {
		return x.storeFailed("get", err, nil)
	}
	if int64(n) > x.rt.settings.MaxResponseBody {
		return notReplayable(rec)
	}
	buf := getBody(n)
	if err := x.h.buffers.take(x.principal, cap(buf)); err != nil {
		putBody(buf)
		return bufferRefused(err, "the stored answer is kept")
	}
	x.inflated = buf // given back with the others
	if err := rec.Inflate(buf); err != nil {
		return x.storeFailed("get", err, nil)
	}
	return nil
}

// bufferRefused answers a request refused room in the buffer budget (err
// is errOverBudget or errOverShare): 503 buffers-full or 429
// too-many-bytes, retry after a second; kept says what was left as it was.
func bufferRefused(err error, kept string) *reply {
	p := probBuffersFull.with("idemproxy holds as many bytes as limits.max_buffered_bytes allows; " + kept + ", retry later")
	if errors.Is(err, errOverShare) {
		p = probTooManyBytes.with("this principal's requests in flight hold their whole share of limits.max_buffered_bytes; " + kept + ", retry later")
	}
	p.retryAfter = time.Second
	return refuse(outcomeRejected, p)
}

// wait watches the key until its first attempt settles or is orphaned, the
// deadline passes or the client goes away. It returns nil when the key is
// free again. It looks at the key when woken (the key's channel went live,
// or an operation settled or freed it) and, as the safety net for a lost
// message, when the first attempt's lease would end and at least every
// safetyPoll.
func (x *exchange) wait(until time.Time) (*claim.Record, time.Duration, error) {
	ctx := x.r.Context()
	watch := x.h.store.Watch(ctx, x.hashedKey)
	defer watch.Stop()
	x.h.waiting.Add(1)
	defer x.h.waiting.Add(-1)
	// Should the subscription never be confirmed, look after a short while.
	timer := time.NewTimer(min(firstLook, time.Until(until)+time.Millisecond))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-watch.C():
		case <-timer.C:
		}
		var rec *claim.Record
		var ttl time.Duration
		err := x.storeOp(ctx, "get", func(ctx context.Context) (err error) {
			rec, ttl, err = x.h.store.Get(ctx, x.hashedKey)
			return err
		})
		if err != nil || rec == nil || rec.State == claim.Completed || rec.Orphaned(ttl) {
			return rec, ttl, err
		}
		if !time.Now().Before(until) {
			return rec, ttl, nil
		}
		timer.Reset(min(max(ttl+time.Millisecond, firstLook), x.h.safetyPoll, time.Until(until)+time.Millisecond))
	}
}

// firstLook is when a waiter looks at the key if its subscription was not
// confirmed; and the shortest interval between its polls.
const firstLook = 50 * time.Millisecond

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
	take := func(n int) error { return x.h.buffers.take(x.principal, n) }
	give := func(n int) { x.h.buffers.give(x.principal, n) }
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

// storeFailed is the reply when store operation op failed before anything
// was forwarded: per store_unavailable, 503 or an unprotected forward. A
// record that cannot be decoded is never overwritten or worked around. A
// client that went away is not a store error.
func (x *exchange) storeFailed(op string, err error, body []byte) *reply {
	if errors.Is(err, context.Canceled) && x.r.Context().Err() != nil {
		return &reply{outcome: outcomeRejected, detail: "client went away", gone: true}
	}
	if qe, ok := errors.AsType[*claim.QuotaError](err); ok {
		x.h.metrics.quotaRefusals.WithLabelValues(x.rt.name).Inc()
		p := probTooManyKeys.with(fmt.Sprintf("this principal has used the %d new idempotency keys this route allows per %s; retries of existing keys still work", x.rt.settings.QuotaNewKeys, x.rt.settings.QuotaWindow))
		p.retryAfter = qe.RetryAfter
		return refuse(outcomeRejected, p).withDetail("new-key quota reached")
	}
	if errors.Is(err, claim.ErrFull) {
		// Not a store error: Redis keeps its last room for the claims in
		// flight, whose completions must not be refused.
		p := probStoreFull.with("the idempotency store is nearly full and keeps its room for requests in flight; nothing was forwarded, retry later")
		p.retryAfter = time.Second
		return refuse(outcomeRejected, p).withDetail(err.Error())
	}
	x.h.metrics.storeErrors.WithLabelValues(op).Inc()
	if errors.Is(err, claim.ErrCorrupt) {
		reason := claim.ReasonCorrupt
		if re, ok := errors.AsType[*claim.RecordError](err); ok {
			reason = re.Reason
		}
		x.h.metrics.recordErrors.WithLabelValues(reason).Inc()
		return refuse(outcomeRecordUnreadable, probRecordCorrupt.with("the record stored for this key is not one idemproxy can read; nothing was forwarded")).withDetail(err.Error())
	}
	if x.rt.settings.FailOpen && body != nil {
		x.log().Warn("store unavailable, forwarding unprotected (fail_open)", "route", x.rt.name, "request_id", x.requestID, "err", err)
		return bypassWith(body, "store unavailable, fail_open: "+err.Error())
	}
	p := probStoreUnavailable.with("the idempotency store cannot be reached; nothing was forwarded, retry later")
	p.retryAfter = time.Second
	return refuse(outcomeStoreUnavailable, p).withDetail(err.Error())
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
		duration: total, upstream: x.upstream, key: x.hashedKey, original: x.original,
		late: x.late, detail: x.detail, traceID: x.traceID(),
	}
	line.log(x.h.log, level)
}
