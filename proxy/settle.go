package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/internal/problemfmt"

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
