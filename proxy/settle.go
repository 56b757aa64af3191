package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

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

// holding is a claim an attempt holds, from its claim to its settlement:
// it keeps the lease alive while the call runs (keepAlive) and settles
// the key once (complete, release, keep, or fail, which applies the
// route's unknown_outcome and reconcile), each settlement returning the
// reply that settled it, and every later one that same reply. It knows
// no HTTP request: any front that claimed a key holds one, and tells it
// only what became of its call.
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

	// mu guards settledBy and renewer, and serialises renewals with
	// settling, so that a renewal never runs after the record was
	// completed or released.
	mu sync.Mutex
	// settledBy is the reply the claim was settled with; nil while it
	// is not settled.
	settledBy *reply
	// renewer renews the lease every lease/3 from keepAlive on.
	renewer *time.Timer
}

// keepAlive renews the lease every lease/3 until the claim is settled,
// on a timer of its own, which nothing the front does can hold back.
func (c *holding) keepAlive() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.settledBy == nil && c.renewer == nil {
		c.renewer = time.AfterFunc(c.a.rt.settings.Lease/3, c.renewDue)
	}
}

// renewDue is the renewal timer: one renewal, and the next one set.
func (c *holding) renewDue() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.settledBy != nil {
		return
	}
	if c.renew() {
		c.renewer.Reset(c.a.rt.settings.Lease / 3)
	}
}

// renew extends the claim's lease by one lease, counted and logged; it
// returns whether renewing again may help (false once the lease was lost
// to another attempt).
func (c *holding) renew() bool {
	a, held := c.a, c.rec
	lease := a.rt.settings.Lease
	ctx, cancel := context.WithTimeout(context.Background(), lease/3)
	defer cancel()
	err := a.storeOp(ctx, "renew", func(ctx context.Context) error { return a.p.store.Renew(ctx, a.hashedKey, held, lease) })
	switch {
	case err == nil:
		a.p.metrics.renewals.WithLabelValues("ok").Inc()
	case errors.Is(err, claim.ErrLeaseLost):
		// Keep forwarding: the upstream call is under way and cannot be
		// taken back. Completion is fenced and will say what happened.
		a.p.metrics.renewals.WithLabelValues("lost").Inc()
		a.log().Error("lease lost while the upstream runs", "route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID)
		return false
	default:
		a.p.metrics.renewals.WithLabelValues("error").Inc()
		a.p.storeError("renew")
		a.log().Warn("lease renewal failed", "route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID, "err", err)
	}
	return true
}

// settle stops renewals and runs f once, before anything reaches the
// client; the reply f settled the claim with is returned to this call
// and every later one (which run nothing). A nil f (a front's deferred
// call, which a panic reaches) settles nothing, and leaves the claim to
// its lease.
func (c *holding) settle(f func() *reply) *reply {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.settledBy != nil {
		return c.settledBy
	}
	if c.renewer != nil {
		c.renewer.Stop()
	}
	if f == nil {
		c.settledBy = settled(outcomeRejected, "the request ended before its claim was settled")
		return c.settledBy
	}
	c.settledBy = f()
	return c.settledBy
}

// settled is the reply the claim was settled with; nil while it is not.
func (c *holding) settled() *reply {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.settledBy
}

// release frees the key, so that a retry executes, once.
func (c *holding) release(why string) *reply {
	return c.settle(func() *reply { return c.releaseNow(why) })
}

// keep holds the claim for one more lease after an unknown outcome, once.
func (c *holding) keep(why string) *reply {
	return c.settle(func() *reply { return c.keepNow(why) })
}

// complete stores rec, the settled answer, once.
func (c *holding) complete(rec *claim.Record) *reply {
	return c.settle(func() *reply { return c.completeNow(rec) })
}

// releaseNow frees the key, so a retry executes; it returns the reply
// that settled the claim.
func (c *holding) releaseNow(why string) *reply {
	a, held := c.a, c.rec
	err := a.detached("release", func(ctx context.Context) error { return a.p.store.Release(ctx, a.hashedKey, held.Token) })
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		return settled(outcomeFenceLost, why+"; the key was already held by another owner, left alone")
	case err != nil:
		// Retries get 409 until the cleanup deletes the claim, once the
		// store answers (or it lapses). Nothing executed twice.
		a.p.storeError("release")
		a.p.unconfirmed.releaseFailed(a.rt.name, a.hashedKey, held, a.claimedAt, a.rt.settings.Lease, err)
		return settled(outcomeReleased, why+"; release failed, the claim is deleted once the store answers: "+err.Error())
	}
	return settled(outcomeReleased, why)
}

// keepNow holds the claim for one more full lease after an unknown
// outcome, so a retry does not execute while the first attempt may still
// be landing; it returns the reply that settled the claim.
func (c *holding) keepNow(why string) *reply {
	a, held := c.a, c.rec
	err := a.detached("renew", func(ctx context.Context) error {
		return a.p.store.Renew(ctx, a.hashedKey, held, a.rt.settings.Lease)
	})
	if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
		a.p.storeError("renew")
	}
	return settled(outcomeClaimed, why+"; claim kept for one lease")
}

// completeNow stores rec, the settled response, retrying briefly; it
// returns the reply that settled the claim. A failure here is the
// dual-write window: the upstream acted and the outcome is not stored. It
// is counted and logged, and the client is answered anyway.
func (c *holding) completeNow(rec *claim.Record) *reply {
	a := c.a
	var how claim.Completion
	err := a.retried("complete", func(ctx context.Context) (err error) {
		how, err = a.p.store.Complete(ctx, a.hashedKey, rec, a.rt.settings.Retention)
		return err
	})
	if err == nil {
		a.p.metrics.storedBytes.Observe(float64(len(rec.Body)))
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

// outcomeUnknownRecord is the completed record that settles a key whose
// request may or may not have been executed (unknown_outcome: fail): the
// outcome-unknown problem as rt's front frames it (HTTP: a 502
// problem+json), replayed to every retry, so nothing executes again. orig
// is the claim it settles, token the writer's. On a reconcile route the
// record keeps since (the first attempt's claim on the store's clock) for
// the next lookup, and tells the client to retry with the same key: a
// retry asks the upstream again.
func outcomeUnknownRecord(rt *route, orig *claim.Record, token claim.Token, now time.Time, timeout, reconcile bool, since time.Time) *claim.Record {
	what := "the connection to the upstream broke after the request was sent"
	if timeout {
		what = "the upstream did not answer in time"
	}
	p := probOutcomeUnknown.with(what + "; it may have acted on the request. It will not be executed again with this idempotency key: check the state of the resource, and to try again send a new key")
	if reconcile {
		p = probOutcomeUnknown.with(what + "; it may have acted on the request, and the upstream could not tell yet. Retry with the same idempotency key: a retry asks the upstream again, and gets its answer, or executes once the upstream says it never acted")
	}
	f := rt.front.frame(p, orig.RequestID)
	if reconcile {
		ms := int64(0)
		if !since.IsZero() {
			ms = since.UnixMilli()
		}
		f.header.Set(unknownSinceHeader, strconv.FormatInt(ms, 10))
	}
	rec := settledRecord(orig, token, claim.Completed, f.status, f.header, now)
	rec.Body = f.body
	return rec
}
