package proxy

// Reconciling a key whose outcome is unknown: taking it over from a
// vanished owner (or a stored outcome-unknown), asking, and settling or
// freeing it by the answer.

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// reconciling is one attempt asking the upstream about its key: the
// take-over, the lookup, and what its answer settles or frees. It takes
// the attempt, and returns the lookup's result with the reply it decided
// (reconcileExisting).
type reconciling struct {
	a *attempt
	// result is the lookup's result so far (reconciled); empty while
	// none was made.
	result string
}

// absentMargin is what an absent answer waits beyond absent_after: the
// route's lease, more than the confirm window between a claim and its
// request's sending, and room for a small step of Redis' clock.
func absentMargin(s *Route) time.Duration { return s.Lease }

// reconcilable reports whether existing, found by a retry of the same
// request on a reconcile route, is one to ask the upstream about: a claim
// whose owner vanished (since zero: TakeOver judges from the orphan), or
// (unknown_outcome: fail) a stored outcome-unknown record (since: its
// first attempt's claim) not asked about within the lookup's timeout.
func (r *reconciling) reconcilable(existing, rec *claim.Record, ttl time.Duration) (since time.Time, ok bool) {
	a := r.a
	rc := a.rt.settings.Reconcile
	if rc == nil || !a.p.codec.SameRequest(existing, rec.Fingerprint) {
		return time.Time{}, false
	}
	if existing.State == claim.InProgress {
		return time.Time{}, existing.Orphaned(ttl)
	}
	return storedUnknown(existing)
}

// storedUnknown reports whether rec is an outcome-unknown record that
// idemproxy stored on a reconcile route, and since, its first attempt's
// claim on the store's clock (zero when not read). It is known by what
// only idemproxy writes: a completed record with the outcome-unknown
// problem's status, no-store, and the marker header, which an upstream's
// answer never keeps (dropOwnHeaders). A streamed record never is one,
// whatever its head carries.
func storedUnknown(rec *claim.Record) (since time.Time, ok bool) {
	if rec.State != claim.Completed || rec.Status != probOutcomeUnknown.Status ||
		rec.Header.Get("Cache-Control") != "no-store" || rec.Header.Get(reconciledHeader) != "" {
		return time.Time{}, false
	}
	vs := rec.Header.Values(unknownSinceHeader)
	if len(vs) != 1 {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil || ms < 0 {
		return time.Time{}, false
	}
	if ms > 0 {
		since = time.UnixMilli(ms)
	}
	return since, true
}

// reconcileExisting takes the key over from existing (an orphan, or a
// stored outcome-unknown record) and asks the upstream what happened:
// found stores and answers the upstream's answer; absent, once the first
// attempt is old enough on Redis' clock, frees the key for this request
// to claim and execute; too early answers the route's in-progress status
// with Retry-After; anything else leaves the key answered outcome-unknown,
// to be asked again by the next retry. It returns the reply decided, nil
// when the key is free or changed: claim again, and the lookup's result
// (lookupFound, lookupAbsent, lookupTooEarly, lookupUnresolved; or why
// none was made, empty when the take-over failed).
func (r *reconciling) reconcileExisting(existing, rec *claim.Record, since time.Time) (*reply, string) {
	rep := r.run(existing, rec, since)
	return rep, r.result
}

// run is reconcileExisting's steps.
func (r *reconciling) run(existing, rec *claim.Record, since time.Time) *reply {
	a := r.a
	s := &a.rt.settings
	rc := s.Reconcile
	a.linkTo(existing)
	if existing.State == claim.Completed {
		if left := rc.Timeout - a.p.now().Sub(existing.Completed); left > 0 {
			// Asked a moment ago: lookups of one key are spaced, at most
			// one per timeout. The key is being reconciled: in progress.
			r.result = "spaced: asked within reconcile.timeout"
			return a.inProgress("the upstream was asked about this key a moment ago; retry after the time in Retry-After, with the same key", max(left, time.Second))
		}
	}
	taker := r.taker(rec)
	err := a.detached("take_over", func(ctx context.Context) (err error) {
		since, err = a.p.store.TakeOver(ctx, a.hashedKey, existing, taker, s.Lease+rc.Timeout, since)
		return err
	})
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		return nil
	case err != nil:
		return a.storeFailed("take_over", err, nil)
	}
	a.p.liveness.forget(a.hashedKey)
	ans := r.ask()
	if s.Unknown != Fail && ans.result != lookupFound {
		// keep and release: a vanished owner's key executes again when
		// its claim lapses; asked first, it does unless found.
		r.reconciled(ans.result, existing, ans.why)
		err := a.detached("release", func(ctx context.Context) error { return a.p.store.Release(ctx, a.hashedKey, taker.Token) })
		if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
			return a.storeFailed("release", err, nil)
		}
		return nil
	}
	if ans.result == lookupAbsent {
		rep, done, why := r.freeAbsent(existing, taker, since)
		if done {
			return rep
		}
		ans = lookupAnswer{result: lookupUnresolved, why: why}
	}
	if ans.result == lookupFound {
		rep, done, why := r.storeFound(existing, taker, ans)
		if done {
			return rep
		}
		ans = lookupAnswer{result: lookupUnresolved, why: why}
	}
	r.reconciled(lookupUnresolved, existing, ans.why)
	unknown := r.putBackUnknown(existing, taker, since)
	return a.replay(unknown).withDetail("reconcile lookup unresolved (" + ans.why + "): outcome-unknown kept, the next retry asks again")
}

// taker is the in-progress claim with which this attempt takes rec's key
// over to ask the upstream: a claim of its own, never taken for one not
// forwarded, outliving its lease by the retention, so that a taker that
// vanishes leaves an orphan to ask about.
func (r *reconciling) taker(rec *claim.Record) *claim.Record {
	a := r.a
	taker := *rec
	taker.State, taker.Created, taker.RequestID = claim.InProgress, a.p.now(), a.requestID
	taker.Completed, taker.Status, taker.Header, taker.Body = time.Time{}, 0, nil, nil
	taker.BodyOmitted, taker.BodyCompressed, taker.Compact = false, false, false
	taker.Mark, taker.Lease, taker.ReadEpoch = claim.MarkNone, 0, false
	taker.Expires, taker.ReadAt = time.Time{}, time.Time{}
	taker.Tail = a.rt.settings.Retention
	_, _ = io.ReadFull(a.p.rand, taker.Token[:])
	return &taker
}

// freeAbsent frees the key taker holds after an absent answer, once the
// first attempt is absent_after (plus a lease) old on the claimer's clock
// against this one and on the store's (FreeAbsent), and this sidecar has
// itself seen the key orphaned that long on its monotonic clock
// (orphans): no stepped clock, nor one clock shared by the store and this
// sidecar, frees a key early. done says the reply is decided (nil: the key
// is free, or changed: claim again); otherwise why the key could not be
// freed, and it stays outcome-unknown.
func (r *reconciling) freeAbsent(existing, taker *claim.Record, since time.Time) (rep *reply, done bool, why string) {
	a := r.a
	s := &a.rt.settings
	after := s.Reconcile.AbsentAfter + absentMargin(s)
	var err error
	if left := max(existing.Created.Add(after).Sub(a.p.now()), a.p.orphans.left(a.hashedKey, after)); left > 0 {
		err = &claim.TooEarlyError{Left: left}
	} else {
		err = a.detached("free_absent", func(ctx context.Context) error {
			return a.p.store.FreeAbsent(ctx, a.hashedKey, taker.Token, since, after)
		})
	}
	var early *claim.TooEarlyError
	switch {
	case err == nil:
		a.p.orphans.forget(a.hashedKey)
		r.reconciled(lookupAbsent, existing, "")
		return nil, true, ""
	case errors.As(err, &early):
		r.reconciled(lookupTooEarly, existing, "")
		r.putBackUnknown(existing, taker, since)
		return r.tooEarly(early), true, ""
	case errors.Is(err, claim.ErrLeaseLost):
		return nil, true, ""
	}
	return nil, false, "freeing the key: " + err.Error()
}

// storeFound settles the key taker holds with the upstream's found
// answer and replays it. done says the reply is decided (nil: the key
// changed, claim again); otherwise why it could not be stored.
func (r *reconciling) storeFound(existing, taker *claim.Record, ans lookupAnswer) (rep *reply, done bool, why string) {
	a := r.a
	found := r.foundRecord(existing, taker, ans)
	err := a.detached("complete", func(ctx context.Context) error {
		_, err := a.p.store.Complete(ctx, a.hashedKey, found, a.rt.settings.Retention)
		return err
	})
	switch {
	case err == nil:
		a.p.orphans.forget(a.hashedKey)
		r.reconciled(lookupFound, existing, "")
		return replayOf(found, outcomeReconciled), true, ""
	case errors.Is(err, claim.ErrLeaseLost):
		return nil, true, ""
	}
	return nil, false, "storing the found answer: " + err.Error()
}

// reconciled counts and logs one lookup's result.
func (r *reconciling) reconciled(result string, first *claim.Record, why string) {
	a := r.a
	r.result = result
	a.p.metrics.reconciled.WithLabelValues(a.rt.name, result).Inc()
	args := []any{"route", a.rt.name, "key", a.hashedKey, "result", result, "original_request_id", first.RequestID, "request_id", a.requestID}
	if why != "" {
		a.log().Warn("reconcile lookup", append(args, "error", why)...)
		return
	}
	a.log().Info("reconcile lookup", args...)
}

// foundRecord is the completed record a found answer settles the key
// with, fenced on writer's token: the upstream's status (or the route's
// reconcile.status), headers and body, marked reconciled.
func (r *reconciling) foundRecord(first, writer *claim.Record, ans lookupAnswer) *claim.Record {
	a := r.a
	header := ans.header
	header.Set(reconciledHeader, "true")
	rec := settledRecord(first, writer.Token, claim.Completed, ans.status, header, a.p.now())
	rec.Body = ans.body
	return rec
}

// putBackUnknown settles the taken-over key as outcome-unknown again,
// fenced on the taker's token, keeping since for the next lookup: a stored
// outcome-unknown goes back as it was (every retry keeps getting the same
// bytes), an orphan is settled as settleOrphan would. Should the write
// fail, the taker's claim outlives its lease and is an orphan the next
// retry asks about: nothing executes.
func (r *reconciling) putBackUnknown(first, taker *claim.Record, since time.Time) *claim.Record {
	a := r.a
	s := &a.rt.settings
	var rec *claim.Record
	if first.State == claim.Completed {
		again := *first
		again.Token, again.Completed = taker.Token, a.p.now() // Completed spaces the next lookup
		// since as TakeOver judged it: a record stored without one (0)
		// keeps the time of its first lookup from now on.
		again.Header = first.Header.Clone()
		again.Header.Set(unknownSinceHeader, strconv.FormatInt(since.UnixMilli(), 10))
		rec = &again
	} else {
		rec = outcomeUnknownRecord(a.rt, first, taker.Token, a.p.now(), true, true, since)
	}
	if err := a.detached("complete", func(ctx context.Context) error {
		_, err := a.p.store.Complete(ctx, a.hashedKey, rec, s.Retention)
		return err
	}); err != nil {
		a.log().Warn("reconcile: could not store outcome-unknown again; the claim lapses into an orphan a retry asks about",
			"route", a.rt.name, "key", a.hashedKey, "error", err)
	}
	return rec
}

// tooEarly answers a retry whose lookup said absent before the key may be
// freed: the first attempt may still be running in the app, or (Skew set)
// the store's clock and this sidecar's differ by more than the freeing
// allows. The detail says which, so that a client (and whoever reads its
// logs) knows the wait is a clock's, not the upstream's, and points at the
// metric that shows the offset; the offset itself goes to the log line
// only: how far a store's clock is off is the operator's, not any
// client's, to know (issue 78).
func (r *reconciling) tooEarly(e *claim.TooEarlyError) *reply {
	a := r.a
	detail := "the upstream has no record of this key yet, and its first attempt may still be running; retry after the time in Retry-After"
	if e.Skew != 0 {
		detail = "the upstream has no record of this key, but the idempotency store's clock and this sidecar's disagree by more than a key may be freed with (idemproxy_store_clock_offset_seconds shows by how much): the key cannot be freed until the clocks agree again; retry after the time in Retry-After"
		a.log().Warn("reconcile: an absent key not freed, the clocks disagree", "route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID,
			"clock_offset_seconds", e.Skew.Seconds(), "max_offset_seconds", claim.MaxClockOffset.Seconds())
	}
	return a.inProgress(detail, max(e.Left, time.Second))
}

// ask is one lookup for this exchange's key, traced.
func (r *reconciling) ask() lookupAnswer {
	a := r.a
	start := time.Now()
	ans := a.p.lookup(context.WithoutCancel(a.ctx), a.rt, a.principal, a.idemKey, a.rt.settings.MaxResponseBody)
	if a.seen != nil {
		a.seen.lookupSpan(start, ans)
	}
	return ans
}
