package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// The owner's answer: ReverseProxy's hooks on a claimed request
// (modifyResponse, errorHandler) store the upstream's answer before the
// client gets any of it, and settle a failure by the route's
// unknown_outcome.

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
