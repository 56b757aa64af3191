package claim

import "time"

// Claims that were never confirmed. A claim's SET may reach Redis and not
// be answered in time (Redis stalled, a partition): its client was told
// nothing was forwarded, and Redis then runs the SET, leaving a claim no
// one owns. An in-progress record therefore says, in its status slot
// (unused while in progress, and ignored there by every earlier version),
// whether its key's TTL was set by the claim itself and with what lease;
// an owner forwards only if its claim was confirmed within ConfirmWindow
// of the record's Created time, on its own (monotonic) clock. So a record
// whose SET ran later than that was never forwarded: the next attempt may
// free it at once (Result.Unforwarded) instead of answering 409 for a
// lease, or, under unknown_outcome: fail, settling it as outcome-unknown.
//
// When the SET ran is read on Redis' clock, in one script: TIME plus the
// key's PTTL, less the PX the claim gave it. Nothing in that depends on
// how late any reply arrives, nor on the reader's clock, nor on a step of
// Redis' clock after the SET (TIME and PTTL move by opposite amounts);
// since Redis 7.0 a replica holds the absolute expiry time too, so a
// reader after a failover computes the same. It is a fixed number of the
// stored claim, and the claim's own round trip reads it (claimScript): the
// owner forwards a marked claim only when that very number, compared with
// the Created time stored beside it, is one no reader takes for never
// forwarded (Forwardable), and renews it first otherwise, which unmarks
// it. No earlier measurement of any clock enters that decision; marking
// at all (clock.go) is only how often the check has to renew.
// docs/reliability.md has the whole argument.
//
// Layout of the in-progress status slot (big-endian uint16): the top two
// bits are the Mark, the low 14 the lease in 100ms units, rounded up (a
// lease too long to fit is written unmarked). Rounding up only ever makes
// a claim look earlier, never later.

// Mark says what an in-progress record's TTL tells about its owner.
type Mark uint8

// Marks of an in-progress record.
const (
	// MarkNone: nothing is known (written by an earlier version, by an
	// owner whose clock was not known to be close to Redis', or a sealed
	// record under store.record_format 1, whose header cannot change
	// after the claim).
	MarkNone Mark = 0
	// MarkClaimed: the key's TTL was set by the claim itself, with
	// Record.Lease.
	MarkClaimed Mark = 1
	// MarkRenewed: a renewal set the TTL since: the owner forwarded.
	MarkRenewed Mark = 2
)

const (
	markShift = 14
	leaseMask = 1<<markShift - 1
	leaseUnit = 100 * time.Millisecond
)

// markMargin covers what the record's millisecond fields round away
// (Created is truncated to the millisecond, PTTL and TIME are read in
// whole units).
const markMargin = 5 * time.Millisecond

// maxConfirmWindow bounds how long after Created an owner may still act
// on its claim's confirmation.
const maxConfirmWindow = time.Second

// ConfirmWindow is how long after a claim's Created time its owner may
// still forward: the claim must be confirmed, and the request on its way,
// within it (at most 1s, and half the lease, so that an owner never
// forwards past its lease).
func ConfirmWindow(lease time.Duration) time.Duration {
	return min(maxConfirmWindow, lease/2)
}

// MarkSlot is the status slot of an in-progress record.
func (r *Record) MarkSlot() uint16 {
	if r.Mark == MarkNone || r.Lease <= 0 {
		return 0
	}
	units := (r.Lease + leaseUnit - 1) / leaseUnit
	if units > leaseMask {
		return 0
	}
	return uint16(r.Mark)<<markShift | uint16(units)
}

// setMarkSlot reads an in-progress record's status slot.
func (r *Record) setMarkSlot(v uint16) {
	r.Mark, r.Lease = Mark(v>>markShift), time.Duration(v&leaseMask)*leaseUnit
	if r.Mark == MarkNone || r.Mark > MarkRenewed || r.Lease == 0 {
		r.Mark, r.Lease = MarkNone, 0 // a lease without a mark tells nothing
	}
}

// Forwardable reports whether r, a claim its owner just made with pttl
// left on its key when Redis' clock read redisNow (both read in the
// claim's own round trip), may be forwarded as it is: no reader can take
// it for never forwarded (NeverForwarded), with markMargin to spare for
// what the two reads round differently. It computes what readers compute,
// from the record as stored (its lease rounded up as the status slot holds
// it, Created to the millisecond). An unmarked claim always may; a marked
// one whose times were not read may not.
func (r *Record) Forwardable(pttl time.Duration, redisNow time.Time) bool {
	if r.State != InProgress || r.Mark != MarkClaimed || r.MarkSlot() == 0 {
		return true
	}
	if pttl <= 0 || redisNow.IsZero() || r.Created.IsZero() {
		return false
	}
	var stored Record
	stored.setMarkSlot(r.MarkSlot())
	tail := time.Duration(0)
	if r.Tail > 0 {
		tail = max(r.Tail.Truncate(time.Millisecond), time.Millisecond)
	}
	created := fromMilli(unixMilli(r.Created))
	ran := redisNow.Add(pttl - stored.Lease - tail)
	return ran.Sub(created) <= ConfirmWindow(stored.Lease)+MaxClockOffset
}

// NeverForwarded reports whether r, found in progress with pttl left on
// its key when Redis' clock read redisNow (both in one script), is a claim
// its owner can never have forwarded: its TTL was set by the claim, and
// the claim ran later than its owner would act on it (ConfirmWindow after
// Created, plus MaxClockOffset between the owner's clock and Redis').
// pttl <= 0 or a zero redisNow (not known) never concludes.
func (r *Record) NeverForwarded(pttl time.Duration, redisNow time.Time) bool {
	if r.State != InProgress || r.Mark != MarkClaimed || r.Lease <= 0 || pttl <= 0 || redisNow.IsZero() || r.Created.IsZero() {
		return false
	}
	ran := redisNow.Add(pttl - r.Lease - r.Tail) // when the claim's SET ran, on Redis' clock
	return ran.Sub(r.Created) > ConfirmWindow(r.Lease)+MaxClockOffset+markMargin
}
