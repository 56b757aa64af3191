package proxy

// The failure half of holding a claim: the call the front sent got no
// usable answer, and the protocol decides what becomes of the key from
// what the front knows (whether the call was sent, whether it timed out)
// and the route's unknown_outcome and reconcile.

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// errClaimTooLate: the owner got to forwarding after its claim's confirm
// window (a slow store, a paused process); it must not forward, since the
// next attempt may take the claim for never forwarded, or its lease may
// have lapsed. A front checks mayForward immediately before it sends.
var errClaimTooLate = errors.New("the claim was confirmed too late to forward")

// mayForward reports whether the claim may still be acted on: a front
// sends nothing after it says no, and fails the call with errClaimTooLate.
func (c *holding) mayForward() bool { return time.Now().Before(c.a.forwardBy) }

// fail settles the claim of a call that got no usable answer, err, and is
// the reply its client gets. sent says whether any of the call may have
// reached the upstream (its headers were written); timedOut whether it
// ended for lack of time (a deadline, the late-call cap, a drain). A call
// never sent frees the key; one sent has an unknown outcome: on a
// reconcile route the upstream is asked first, then unknown_outcome
// applies (fail: the outcome-unknown answer, framed by the route's front,
// is stored and replayed; release; keep). The reply's unknown says why the
// outcome is unknown.
func (c *holding) fail(sent, timedOut bool, err error) *reply {
	a := c.a
	if errors.Is(err, errClaimTooLate) {
		c.release(err.Error() + ": nothing forwarded")
		p := probStoreUnavailable.with("the idempotency store confirmed the claim too late to forward safely; nothing was forwarded, retry later")
		p.retryAfter = time.Second
		return refuse(outcomeStoreUnavailable, p)
	}
	if !sent {
		v := c.release("upstream unreachable, request never sent: " + err.Error())
		return settledAs(v, probUpstreamDown.with("the request was not sent to the upstream; it is safe to retry"))
	}
	unknown := "outcome unknown: " + err.Error()
	s := &a.rt.settings
	a.p.metrics.unknownOutcomes.WithLabelValues(a.rt.name, s.Unknown.String()).Inc()
	reconcile := s.Reconcile != nil
	if reconcile {
		if rep := c.reconcile(timedOut, unknown); rep != nil {
			rep.unknown = unknown
			return rep
		}
	}
	var v *reply
	switch s.Unknown {
	case Fail:
		rec := outcomeUnknownRecord(a.rt, c.rec, c.rec.Token, a.p.now(), timedOut, reconcile, c.setAt)
		v = c.settle(func() *reply {
			v := c.completeNow(rec)
			if v.outcome == outcomeStored {
				v.detail = unknown + "; stored as 502 outcome-unknown, replayed to every retry"
			}
			return v
		})
		return &reply{outcome: v.outcome, detail: v.detail, record: rec, unknown: unknown}
	case Release:
		v = c.release(unknown)
	default:
		v = c.keep(unknown)
	}
	p := probUpstreamFailed.with("the upstream may have acted; retry later to learn the outcome")
	if timedOut {
		p = probUpstreamTimeout.with(fmt.Sprintf("no answer within %s; the upstream may have acted", a.p.upstreamTimeout))
	}
	rep := settledAs(v, p)
	rep.unknown = unknown
	return rep
}

// reconcile is the owner of a first attempt whose outcome is unknown
// (unknown says why) asking the upstream before it settles the key as
// unknown_outcome says, so that its own client can get the real answer:
// the reply, once it settled. It returns nil when the caller is to settle
// as without reconcile: the lookup was unresolved, or (keep, release)
// said anything but found. Under fail an absent answer is too early for
// the owner (its own call just ended): the key is left outcome-unknown,
// and the client is told when to ask again.
func (c *holding) reconcile(timedOut bool, unknown string) *reply {
	a := c.a
	r := &reconciling{a: a}
	s := &a.rt.settings
	ans := r.ask()
	switch ans.result {
	case lookupFound:
		found := r.foundRecord(c.rec, c.rec, ans)
		v := c.settle(func() *reply {
			v := c.completeNow(found)
			if v.outcome == outcomeStored {
				v.outcome = outcomeReconciled
				v.detail = unknown + "; the reconcile lookup found the effect: its answer stored and replayed"
			}
			return v
		})
		r.reconciled(lookupFound, c.rec, "")
		return &reply{outcome: v.outcome, detail: v.detail, record: found}
	case lookupAbsent:
		if s.Unknown != Fail {
			r.reconciled(lookupTooEarly, c.rec, "")
			return nil // keep holds the claim one lease, release frees it: as without reconcile
		}
		rec := outcomeUnknownRecord(a.rt, c.rec, c.rec.Token, a.p.now(), timedOut, true, c.setAt)
		c.settle(func() *reply {
			v := c.completeNow(rec)
			v.detail = unknown + "; the reconcile lookup said absent before absent_after: outcome-unknown stored, a retry asks again"
			return v
		})
		r.reconciled(lookupTooEarly, c.rec, "")
		return r.tooEarly(&claim.TooEarlyError{Left: s.Reconcile.AbsentAfter + absentMargin(s) - time.Since(a.claimedAt)})
	}
	r.reconciled(lookupUnresolved, c.rec, ans.why)
	return nil
}
