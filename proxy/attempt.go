package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// newClaim is the in-progress record this attempt claims the key with.
func (a *attempt) newClaim(fp claim.Fingerprint) *claim.Record {
	rec := &claim.Record{
		State:       claim.InProgress,
		Fingerprint: fp,
		Created:     a.p.now(),
		RequestID:   a.requestID,
		Trace:       a.trace,
		// A request that says when it was first sent learns of a store
		// that lost its data in its own claim's round trip.
		ReadEpoch: a.hasFirstSent,
	}
	_, _ = io.ReadFull(a.p.rand, rec.Token[:])
	if a.rt.settings.Unknown == Fail || a.rt.settings.Reconcile != nil {
		// The claim outlives its lease, so that an owner that vanishes
		// leaves an orphan the next attempt settles (or asks the upstream
		// about, on a reconcile route), not a free key.
		rec.Tail = a.rt.settings.Retention
	}
	return rec
}

// ownOrAnswer claims the key with rec, or answers from the record
// already there: waiting for a first attempt in progress (concurrent:
// wait), settling an orphan, reconciling, or replaying, 409 or 422. A key
// freed while waiting, or an orphan that changed under us, is claimed
// again. It returns the claim this attempt holds when it owns the key
// (the caller forwards, then gives its slot back), else the reply
// decided. authorize, when set, is asked once before anything about a key
// someone else holds is told.
func (a *attempt) ownOrAnswer(rec *claim.Record, body []byte, authorize func() *reply) (*holding, *reply) {
	var waitUntil time.Time
	if s := &a.rt.settings; s.Wait {
		waitUntil = a.start.Add(s.MaxWait)
	}
	for attempt := 0; ; attempt++ {
		res, err := a.claim(rec)
		if errors.Is(err, claim.ErrLeaseLost) && attempt < maxOrphanSettles {
			// Made, then freed before it was confirmed (redisstore.Store.Claim):
			// claim again, under a new token, so that nothing fenced on
			// the freed claim's token can touch the new one.
			_, _ = io.ReadFull(a.p.rand, rec.Token[:])
			continue
		}
		if err != nil {
			return nil, a.storeFailed("claim", err, body)
		}
		if res.Renewed {
			a.log().Warn("claim renewed before forwarding: its SET ran, on the store's clock, too long after this sidecar sent it for a retry not to take it for never forwarded (a clock off or stepped, on the store's host or this one); claims are written unmarked until the clocks are measured close again",
				"route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID)
		}
		if res.Claimed {
			return a.owned(res, rec)
		}
		if res.Unforwarded && attempt < maxOrphanSettles {
			// A claim that was never confirmed in time: its owner never
			// forwarded and never will. Nothing happened; free it.
			if rep := a.clearUnforwarded(res.Existing); rep != nil {
				return nil, rep
			}
			continue
		}
		if attempt == 0 && authorize != nil {
			if rep := authorize(); rep != nil {
				return nil, rep // the caller may no longer learn anything about this key
			}
		}
		if rep, again := a.fromExisting(res, rec, waitUntil, attempt < maxOrphanSettles); !again {
			return nil, rep
		}
	}
}

// owned is a claim this attempt made (res): the claim it holds, with the
// slot to forward in, or the reply when the request is refused before it
// (first sent too long ago, or the route's max_in_flight reached).
func (a *attempt) owned(res claim.Result, rec *claim.Record) (*holding, *reply) {
	if rep := a.refuseUnrecorded(rec); rep != nil {
		return nil, rep
	}
	sl, refused := a.p.forwarding.take(a.rt.name, a.principal, a.rt.settings.MaxInFlight, a.rt.settings.MaxInFlightShare)
	if sl == nil {
		return nil, a.shed(rec, refused)
	}
	return &holding{a: a, rec: rec, slot: sl, setAt: res.SetAt()}, nil
}

// fromExisting answers from the record res found under the key (rec is
// this attempt's claim): it waits for a first attempt in progress until
// waitUntil, holds a live owner's key, reconciles or settles an orphan
// (when settle: not too often yet), and otherwise answers existing. again
// says to claim the key again (freed, or changed under us).
func (a *attempt) fromExisting(res claim.Result, rec *claim.Record, waitUntil time.Time, settle bool) (rep *reply, again bool) {
	existing, ttl := res.Existing, res.TTL
	if existing.State == claim.InProgress && a.p.codec.SameRequest(existing, rec.Fingerprint) && !existing.Orphaned(ttl) && time.Now().Before(waitUntil) {
		var err error
		existing, ttl, err = a.wait(waitUntil)
		if err != nil {
			return a.storeFailed("get", err, nil), false
		}
		if existing == nil {
			return nil, true // released or lapsed: claim it ourselves
		}
	}
	r := &reconciling{a: a}
	since, reconcile := r.reconcilable(existing, rec, ttl)
	if reconcile {
		// Seen orphaned on this sidecar's own clock from now on: freeAbsent
		// counts absent_after from then too (orphans).
		a.p.orphans.see(a.hashedKey)
	}
	if rep := a.ownerAlive(existing, rec, ttl); rep != nil {
		return rep, false
	}
	if reconcile && settle {
		rep, _ := r.reconcileExisting(existing, rec, since)
		return rep, rep == nil // nil: freed, or changed under us
	}
	if a.p.codec.SameRequest(existing, rec.Fingerprint) && existing.Orphaned(ttl) && settle {
		rep := a.settleOrphan(existing)
		return rep, rep == nil // nil: the key changed under us
	}
	return a.answerExisting(existing, rec.Fingerprint, ttl), false
}

// ownerAlive notes existing, a claim in progress for the same request,
// on this sidecar's own clock, and answers the route's in-progress status
// while it looks orphaned but its owner has not yet been seen without a
// sign of life for a full lease (liveness.go): a step of the store's
// clock lowers a live owner's TTL as much as its death does. It returns
// nil when existing may be acted on as it is: not orphaned, or its owner
// gone.
func (a *attempt) ownerAlive(existing, rec *claim.Record, ttl time.Duration) *reply {
	if existing.State != claim.InProgress || !a.p.codec.SameRequest(existing, rec.Fingerprint) {
		return nil
	}
	gone, wait := a.p.liveness.see(a.hashedKey, existing, max(a.rt.settings.Lease, existing.Lease))
	if gone || !existing.Orphaned(ttl) {
		return nil
	}
	return a.inProgress("retry after the time in Retry-After; the first attempt's owner has not renewed its lease lately, and is taken for gone only once this sidecar has seen no sign of it for a whole lease", wait)
}

// shed answers a request whose route forwards max_in_flight first attempts
// already: its claim is released (nothing was forwarded, so a retry
// really retries) and the client told when to come back.
func (a *attempt) shed(rec *claim.Record, refused string) *reply {
	err := a.detached("release", func(ctx context.Context) error { return a.p.store.Release(ctx, a.hashedKey, rec.Token) })
	detail := "the route forwards max_in_flight requests already; nothing was forwarded and the key is free, retry later"
	if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
		// Nothing was forwarded: the cleanup deletes the claim once the
		// store answers.
		a.p.storeError("release")
		a.p.unconfirmed.releaseFailed(a.rt.name, a.hashedKey, rec, a.claimedAt, a.rt.settings.Lease, err)
		detail = "the route forwards max_in_flight requests already; nothing was forwarded, retry later"
	}
	if refused != refusedCap {
		detail = "this principal holds its share of the route's max_in_flight (the rest is kept for others); nothing was forwarded, retry later"
	}
	a.p.metrics.overloaded.WithLabelValues(a.rt.name, refused).Inc()
	p := probOverloaded.with(detail)
	p.retryAfter = time.Second
	return refuse(outcomeRejected, p)
}

// settleOrphan settles a claim whose owner vanished (unknown_outcome:
// fail) as outcome-unknown, and answers with it: the request may have
// executed, so this attempt must not. It returns nil, having decided
// nothing, when the key changed first.
func (a *attempt) settleOrphan(orphan *claim.Record) *reply {
	a.linkTo(orphan)
	rec := outcomeUnknownRecord(a.rt, orphan, claim.Token{}, a.p.now(), true, false, time.Time{})
	_, _ = io.ReadFull(a.p.rand, rec.Token[:])
	err := a.detached("complete", func(ctx context.Context) error {
		return a.p.store.SettleOrphan(ctx, a.hashedKey, orphan, rec, a.rt.settings.Retention)
	})
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		return nil
	case err != nil:
		return a.storeFailed("complete", err, nil)
	}
	a.p.liveness.forget(a.hashedKey)
	a.p.metrics.unknownOutcomes.WithLabelValues(a.rt.name, unknownOrphan).Inc()
	return a.replay(rec).withDetail("the claim's owner vanished without settling (lease lapsed): settled as 502 outcome-unknown")
}

// claim runs the one-round-trip claim-or-read, timed. The record's
// Created time is now, and the claim must be confirmed within
// claim.ConfirmWindow of it: an owner forwards only then (forwardBy, on
// the monotonic clock), so a claim whose SET runs later can be told never
// forwarded by the next attempt. A claim whose reply did not come may
// still land: it is cleaned up in the background.
func (a *attempt) claim(rec *claim.Record) (claim.Result, error) {
	s := &a.rt.settings
	a.claimedAt, rec.Created = time.Now(), a.p.now()
	a.forwardBy = a.claimedAt.Add(claim.ConfirmWindow(s.Lease))
	var q claim.Quota
	if s.QuotaNewKeys > 0 {
		q = claim.Quota{Key: a.p.codec.QuotaKey(a.principal, a.rt.scope), Limit: s.QuotaNewKeys, Window: s.QuotaWindow}
	}
	// Not the request's context: a client that hangs up cannot unsend a
	// SET already written, and cancelling it would only turn a claim
	// into one to clean up, work a client could cause for free.
	ctx, cancel := context.WithDeadline(context.WithoutCancel(a.ctx), a.forwardBy)
	defer cancel()
	var res claim.Result
	err := a.storeOp(ctx, "claim", func(ctx context.Context) (err error) {
		res, err = a.p.store.Claim(ctx, a.hashedKey, rec, s.Lease, q)
		return err
	})
	if err != nil && mayHaveWritten(err) {
		a.p.unconfirmed.add(a.rt.name, a.hashedKey, rec.Token, a.claimedAt.Add(s.Lease+rec.Tail), claim.StillSending(err))
	}
	return res, err
}

// clearUnforwarded frees a claim its owner never forwarded (res.Existing,
// found with res.Unforwarded), so this attempt can claim the key. It
// returns the reply when the store failed, nil to claim again.
func (a *attempt) clearUnforwarded(ghost *claim.Record) *reply {
	err := a.detached("release", func(ctx context.Context) error { return a.p.store.ReleaseUnforwarded(ctx, a.hashedKey, ghost) })
	switch {
	case err == nil:
		a.p.metrics.unconfirmed.WithLabelValues(unconfirmedOnRetry).Inc()
		a.log().Info("unconfirmed claim", "route", a.rt.name, "key", a.hashedKey, "result", unconfirmedOnRetry,
			"original_request_id", ghost.RequestID, "request_id", a.requestID)
		return nil
	case errors.Is(err, claim.ErrLeaseLost):
		return nil // it changed under us: look again
	}
	return a.storeFailed("release", err, nil)
}

// answerExisting answers from a record another attempt wrote.
func (a *attempt) answerExisting(rec *claim.Record, fp claim.Fingerprint, ttl time.Duration) *reply {
	a.linkTo(rec)
	switch {
	case !a.p.codec.SameRequest(rec, fp):
		return refuse(outcomeMismatch, probMismatch.with("this idempotency key was first used with a different method, path, query, body or fingerprinted header"))
	case rec.State == claim.InProgress:
		return a.inProgress("retry after the time in Retry-After; the first attempt is still running", ttl)
	case rec.State == claim.Streamed:
		return a.attach(rec)
	case rec.BodyOmitted:
		return notReplayable(rec)
	}
	return a.replay(rec)
}

// inProgress answers a retry while the key's first attempt (or a lookup
// about it) runs: the route's in_progress_status (409, or 429 / 503, what
// generic retrying clients retry) with Retry-After.
func (a *attempt) inProgress(detail string, retryAfter time.Duration) *reply {
	p := probInProgress.with(detail)
	if st := a.rt.settings.InProgressStatus; st != 0 {
		p.Status = st
	}
	p.retryAfter = retryAfter
	return refuse(outcomeConflict, p)
}

// replay is the stored response, byte for byte, marked as a replay.
func (a *attempt) replay(rec *claim.Record) *reply {
	return replayOf(rec, outcomeReplayed)
}

// wait watches the key until its first attempt settles or is orphaned, the
// deadline passes or the client goes away. It returns nil when the key is
// free again. It looks at the key when woken (the key's channel went live,
// or an operation settled or freed it) and, as the safety net for a lost
// message, when the first attempt's lease would end and at least every
// safetyPoll.
func (a *attempt) wait(until time.Time) (*claim.Record, time.Duration, error) {
	ctx := a.ctx
	watch := a.p.store.Watch(ctx, a.hashedKey)
	defer watch.Stop()
	a.p.waiting.Add(1)
	defer a.p.waiting.Add(-1)
	// Should the subscription never be confirmed, look after a short while.
	timer := time.NewTimer(min(firstLook, time.Until(until)+time.Millisecond))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-watch.C():
			a.p.metrics.wakeupNotify.Inc()
		case <-timer.C:
			a.p.metrics.wakeupPoll.Inc()
		}
		var rec *claim.Record
		var ttl time.Duration
		err := a.storeOp(ctx, "get", func(ctx context.Context) (err error) {
			rec, ttl, err = a.p.store.Get(ctx, a.hashedKey)
			return err
		})
		if err != nil || rec == nil || rec.State == claim.Completed || rec.Orphaned(ttl) {
			return rec, ttl, err
		}
		if !time.Now().Before(until) {
			return rec, ttl, nil
		}
		timer.Reset(min(max(ttl+time.Millisecond, firstLook), a.p.safetyPoll, time.Until(until)+time.Millisecond))
	}
}

// storeFailed is the reply when store operation op failed before anything
// was forwarded: per store_unavailable, 503 or an unprotected forward. A
// record that cannot be decoded is never overwritten or worked around. A
// client that went away is not a store error.
func (a *attempt) storeFailed(op string, err error, body []byte) *reply {
	if errors.Is(err, context.Canceled) && a.ctx.Err() != nil {
		return &reply{outcome: outcomeRejected, detail: "client went away", gone: true}
	}
	if qe, ok := errors.AsType[*claim.QuotaError](err); ok {
		a.p.metrics.quotaRefusals.WithLabelValues(a.rt.name).Inc()
		p := probTooManyKeys.with(fmt.Sprintf("this principal has used the %d new idempotency keys this route allows per %s; retries of existing keys still work", a.rt.settings.QuotaNewKeys, a.rt.settings.QuotaWindow))
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
	a.p.storeError(op)
	if errors.Is(err, claim.ErrCorrupt) {
		reason := claim.ReasonCorrupt
		if re, ok := errors.AsType[*claim.RecordError](err); ok {
			reason = re.Reason
		}
		a.p.metrics.recordErrors.WithLabelValues(reason).Inc()
		return refuse(outcomeRecordUnreadable, probRecordCorrupt.with("the record stored for this key is not one idemproxy can read; nothing was forwarded")).withDetail(err.Error())
	}
	if a.rt.settings.FailOpen && body != nil {
		a.log().Warn("store unavailable, forwarding unprotected (fail_open)", "route", a.rt.name, "request_id", a.requestID, "err", err)
		return bypassWith(body, "store unavailable, fail_open: "+err.Error())
	}
	p := probStoreUnavailable.with("the idempotency store cannot be reached; nothing was forwarded, retry later")
	p.retryAfter = time.Second
	return refuse(outcomeStoreUnavailable, p).withDetail(err.Error())
}

// maxOrphanSettles bounds how often one request tries to settle an
// orphaned claim that keeps changing under it.
const maxOrphanSettles = 3

// firstLook is when a waiter looks at the key if its subscription was not
// confirmed; and the shortest interval between its polls.
const firstLook = 50 * time.Millisecond
