package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/internal/problemfmt"

	"github.com/idemproxy/idemproxy/claim"
)

// Store-write retry after the upstream answered: the dual-write window.
// The client is answered either way; these bound how long it waits.
var storeRetryWaits = []time.Duration{0, 25 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// settleTimeout bounds each settle operation (complete, release, keep).
const settleTimeout = 2 * time.Second

// settled is the reply that settled an attempt's claim: how the key
// ended (the outcome, and what the log line says of it), with nothing to
// write: the client's answer is the upstream's, or the one the caller
// builds on it (settledAs).
func settled(outcome, detail string) *reply {
	return &reply{outcome: outcome, detail: detail}
}

// settledAs is p, the answer to the client of an attempt whose claim v
// settled, counted and logged as v says.
func settledAs(v *reply, p problem) *reply {
	return refuse(v.outcome, p).withDetail(v.detail)
}

// settle stops renewals and runs f once, before anything reaches the
// client; the reply f settled the claim with is the request's outcome,
// and settle returns it, to this call and every later one (which run
// nothing). A nil f (the deferred call a panic reaches) settles nothing.
func (o *owner) settle(f func() *reply) *reply {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.settledBy != nil {
		return o.settledBy
	}
	o.renewer.Stop()
	if f == nil { // a panic unwinds: nothing decided, the claim stays
		o.settledBy = settled(outcomeRejected, "the request ended before its claim was settled")
		return o.settledBy
	}
	o.settledBy = f()
	o.x.outcome, o.x.detail = o.settledBy.outcome, o.settledBy.detail
	return o.settledBy
}

// settleCtx is detached from the client and bounded.
func settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), settleTimeout)
}

// holding is a claim an attempt holds, and what its owner does with it:
// renew it while the upstream runs, and settle it once (release, keep,
// complete), each settlement returning the reply that settled it. It
// knows no HTTP request: any front that claimed a key holds one.
type holding struct {
	a *attempt
	// rec is the record the key was claimed with: its token fences
	// every write.
	rec *claim.Record
	// slot is the route's max_in_flight slot the claim is forwarded in,
	// given back by whoever forwards.
	slot *slot
	// setAt is when the claim ran on the store's clock, as its own round
	// trip read it; zero when not read.
	setAt time.Time
}

// release frees the key, so a retry executes; it returns the reply
// that settled the claim.
func (c *holding) release(why string) *reply {
	a, held := c.a, c.rec
	err := a.detached("release", func(ctx context.Context) error { return a.h.store.Release(ctx, a.hashedKey, held.Token) })
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		return settled(outcomeFenceLost, why+"; the key was already held by another owner, left alone")
	case err != nil:
		// Retries get 409 until the cleanup deletes the claim, once the
		// store answers (or it lapses). Nothing executed twice.
		a.h.storeError("release")
		a.h.unconfirmed.releaseFailed(a.rt.name, a.hashedKey, held, a.claimedAt, a.rt.settings.Lease, err)
		return settled(outcomeReleased, why+"; release failed, the claim is deleted once the store answers: "+err.Error())
	}
	return settled(outcomeReleased, why)
}

// keep holds the claim for one more full lease after an unknown
// outcome, so a retry does not execute while the first attempt may still
// be landing; it returns the reply that settled the claim.
func (c *holding) keep(why string) *reply {
	a, held := c.a, c.rec
	err := a.detached("renew", func(ctx context.Context) error {
		return a.h.store.Renew(ctx, a.hashedKey, held, a.rt.settings.Lease)
	})
	if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
		a.h.storeError("renew")
	}
	return settled(outcomeClaimed, why+"; claim kept for one lease")
}

// complete stores rec, the settled response, retrying briefly; it returns
// the reply that settled the claim. A failure here is the dual-write
// window: the upstream acted and the outcome is not stored. It is
// counted and logged, and the client is answered anyway.
func (c *holding) complete(rec *claim.Record) *reply {
	a := c.a
	var how claim.Completion
	err := a.retried("complete", func(ctx context.Context) (err error) {
		how, err = a.h.store.Complete(ctx, a.hashedKey, rec, a.rt.settings.Retention)
		return err
	})
	if err == nil {
		a.h.metrics.storedBytes.Observe(float64(len(rec.Body)))
		if how == claim.StoredAfterLapse {
			return settled(outcomeStored, "stored after the lease had lapsed; nobody had claimed the key since")
		}
		return settled(outcomeStored, "")
	}
	if errors.Is(err, claim.ErrLeaseLost) {
		return settled(outcomeFenceLost, "the lease lapsed and another attempt holds the key; its record was not overwritten")
	}
	return settled(outcomeStoreError, "upstream answered but the response could not be stored (dual-write window): "+err.Error())
}

// modifyResponse settles a protected request once the upstream answered,
// before ReverseProxy writes anything to the client.
func (h *Handler) modifyResponse(resp *http.Response) error {
	o := ownerFrom(resp.Request.Context())
	if o == nil {
		return nil
	}
	x := o.x
	dropOwnHeaders(resp.Header)
	x.upstream = time.Since(o.sent)
	h.metrics.upstream.WithLabelValues(x.rt.name).Observe(x.upstream.Seconds())
	x.status = resp.StatusCode
	if x.rt.releaseOn[resp.StatusCode] {
		o.settle(func() *reply {
			return o.held.release(fmt.Sprintf("upstream answered %d, which is in release_on", resp.StatusCode))
		})
		return nil
	}
	if x.repeatable() {
		defer resp.Header.Set(repeatabilityResult, "accepted") // executed; after the head is stored, never stored itself
	}
	if h.streams && x.rt.settings.Stream && isStream(resp) && o.startStream(resp) {
		return nil
	}
	return o.storeAnswer(resp)
}

// storeAnswer reads the upstream's answer (resp, not a stream) up to the
// route's max_response_body and settles the key with it: whole, or with
// its body omitted when the answer is larger (then the client still gets
// all of it). The client's copy reads the buffer, lent.
func (o *owner) storeAnswer(resp *http.Response) error {
	x, h := o.x, o.x.h
	limit := x.rt.settings.MaxResponseBody
	expected := resp.ContentLength
	if expected > limit {
		expected = limit + 1
	}
	force := func(n int) error { h.buffers.force(x.holder, n); return nil }
	give := func(n int) { h.buffers.give(x.holder, n) }
	buf, err := readAll(io.LimitReader(resp.Body, limit+1), expected, force, give)
	x.respBuf = buf
	if err != nil {
		// The upstream answered, so it may have acted, but the body broke
		// off: there is nothing whole to store. errorHandler applies
		// unknown_outcome.
		return fmt.Errorf("read upstream response body: %w", err)
	}
	rec := settledRecord(o.held.rec, o.held.rec.Token, claim.Completed, resp.StatusCode, storedHeader(x.rt, resp.Header), x.h.now())
	if x.rt.settings.AdvertiseRetention {
		resp.Header.Set(retentionHeader, retentionSeconds(x.rt.settings.Retention))
	}
	// max_response_body caps the whole stored response, headers included:
	// an upstream answering with megabytes of headers cannot fill Redis.
	switch size := int64(len(buf)) + headerSize(rec.Header); {
	case int64(len(buf)) > limit:
		rec.BodyOmitted, rec.Header = true, nil
		resp.Body = readCloser{io.MultiReader(x.lend(buf), resp.Body), resp.Body}
	case size > limit:
		rec.BodyOmitted, rec.Header = true, nil
		resp.Body.Close()
		resp.Body = x.lend(buf)
	default:
		rec.Body = buf
		resp.Body.Close()
		resp.Body = x.lend(buf)
	}
	o.settle(func() *reply { return o.held.complete(rec) })
	return nil
}

// settledRecord is the record that settles claimed's key, fenced on
// token: state (Completed, or Streamed for a stream's head), status and
// header, with the claim's fingerprint, creation, request id and trace,
// completed at completed (zero for a stream's head). Every record that
// settles a key is built here.
func settledRecord(claimed *claim.Record, token claim.Token, state claim.State, status int, header http.Header, completed time.Time) *claim.Record {
	return &claim.Record{
		State:            state,
		Token:            token,
		Fingerprint:      claimed.Fingerprint,
		KeyedFingerprint: claimed.KeyedFingerprint,
		Created:          claimed.Created,
		Completed:        completed,
		RequestID:        claimed.RequestID,
		Trace:            claimed.Trace,
		Status:           status,
		Header:           header,
	}
}

// storedHeader is what of an upstream's answer header rt stores: a copy,
// less its exclude_headers (idemproxy's own were dropped on arrival:
// dropOwnHeaders).
func storedHeader(rt *route, h http.Header) http.Header {
	stored := h.Clone()
	for _, name := range rt.settings.ExcludeHeaders {
		stored.Del(name)
	}
	return stored
}

// retentionSeconds is d in whole seconds, for retentionHeader.
func retentionSeconds(d time.Duration) string {
	return strconv.FormatInt(int64(d/time.Second), 10)
}

// headerSize is what h takes in a stored record, about.
func headerSize(h http.Header) int64 {
	n := 0
	for k, vs := range h {
		n += len(k) + 2
		for _, v := range vs {
			n += len(v) + 2
		}
	}
	return int64(n)
}

// errorHandler answers when the upstream gave no usable response. For a
// protected request, whether the upstream may have acted decides the claim.
func (h *Handler) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	o := ownerFrom(r.Context())
	if o == nil { // bypassed: no claim to settle
		h.passThroughError(w, r, err)
		return
	}
	o.x.respond(o.failed(r, err))
}

// failed settles the claim of a request the upstream gave no usable
// answer to, and is the reply its client gets: the outcome decided by the
// settlement.
func (o *owner) failed(r *http.Request, err error) *reply {
	x, h := o.x, o.x.h
	if x.upstream == 0 {
		x.upstream = time.Since(o.sent)
	}
	if errors.Is(err, errClaimTooLate) {
		o.settle(func() *reply { return o.held.release(err.Error() + ": nothing forwarded") })
		p := probStoreUnavailable.with("the idempotency store confirmed the claim too late to forward safely; nothing was forwarded, retry later")
		p.retryAfter = time.Second
		return refuse(outcomeStoreUnavailable, p)
	}
	if !o.wrote.Load() {
		v := o.settle(func() *reply { return o.held.release("upstream unreachable, request never sent: " + err.Error()) })
		return settledAs(v, probUpstreamDown.with("the request was not sent to the upstream; it is safe to retry"))
	}
	if cause := context.Cause(r.Context()); cause != nil && cause != r.Context().Err() {
		err = fmt.Errorf("%w (%w)", cause, err)
	}
	x.unknown = "outcome unknown: " + err.Error()
	timeout := isTimeout(err) || errors.Is(err, errLateCap) || errors.Is(err, errAbandoned)
	policy := x.rt.settings.Unknown
	h.metrics.unknownOutcomes.WithLabelValues(x.rt.name, policy.String()).Inc()
	reconcile := x.rt.settings.Reconcile != nil
	if reconcile {
		if rep := x.ownerReconciles(o, timeout); rep != nil {
			return rep
		}
	}
	var v *reply
	switch policy {
	case Fail:
		rec := h.outcomeUnknownRecord(o.held.rec, o.held.rec.Token, h.now(), timeout, x.rt.settings.Problems, reconcile, o.held.setAt)
		v = o.settle(func() *reply {
			v := o.held.complete(rec)
			if v.outcome == outcomeStored {
				v.detail = x.unknown + "; stored as 502 outcome-unknown, replayed to every retry"
			}
			return v
		})
		return &reply{outcome: v.outcome, detail: v.detail, record: rec}
	case Release:
		v = o.settle(func() *reply { return o.held.release(x.unknown) })
	default:
		v = o.settle(func() *reply { return o.held.keep(x.unknown) })
	}
	p := probUpstreamFailed.with("the upstream may have acted; retry later to learn the outcome")
	if timeout {
		p = probUpstreamTimeout.with(fmt.Sprintf("no answer within %s; the upstream may have acted", h.upstreamTimeout))
	}
	return settledAs(v, p)
}

// outcomeUnknownRecord is the completed record that settles a key whose
// request may or may not have been executed (unknown_outcome: fail): a
// 502 outcome-unknown problem, replayed to every retry, so nothing
// executes again. orig is the claim it settles, token the writer's. On a
// reconcile route the record keeps since (the first attempt's claim on
// Redis' clock) for the next lookup, and tells the client to retry with
// the same key: a retry asks the upstream again.
func (h *Handler) outcomeUnknownRecord(orig *claim.Record, token claim.Token, now time.Time, timeout bool, problems *problemfmt.Format, reconcile bool, since time.Time) *claim.Record {
	what := "the connection to the upstream broke after the request was sent"
	if timeout {
		what = "the upstream did not answer in time"
	}
	p := probOutcomeUnknown.with(what + "; it may have acted on the request. It will not be executed again with this idempotency key: check the state of the resource, and to try again send a new key")
	if reconcile {
		p = probOutcomeUnknown.with(what + "; it may have acted on the request, and the upstream could not tell yet. Retry with the same idempotency key: a retry asks the upstream again, and gets its answer, or executes once the upstream says it never acted")
	}
	body, contentType := h.problems.render(p, orig.RequestID, problems)
	header := http.Header{
		"Content-Type":  {contentType},
		"Cache-Control": {"no-store"},
	}
	if reconcile {
		ms := int64(0)
		if !since.IsZero() {
			ms = since.UnixMilli()
		}
		header.Set(unknownSinceHeader, strconv.FormatInt(ms, 10))
	}
	rec := settledRecord(orig, token, claim.Completed, p.Status, header, now)
	rec.Body = body
	return rec
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
