package claim

import "time"

// Claims that were never confirmed. A claim's SET may reach Redis and not
// be answered in time (Redis stalled, a partition): its client was told
// nothing was forwarded, and Redis then runs the SET, leaving a claim no
// one owns. An in-progress record therefore says, in its status slot
// (unused while in progress, and ignored there by every earlier version),
// whether its key's TTL was set by the claim itself and with what lease;
// an owner forwards only if its claim was confirmed within ConfirmWindow
// of the record's Created time, on its own clock. So a record whose SET
// ran later than that, by the TTL it still has, was never forwarded: the
// next attempt may free it at once (Result.Unforwarded) instead of
// answering 409 for a lease, or, under unknown_outcome: fail, settling it
// as outcome-unknown.
//
// Layout of the in-progress status slot (big-endian uint16): the top two
// bits are the Mark, the low 14 the lease in 100ms units, rounded up (a
// lease too long to fit is written unmarked).

// Mark says what an in-progress record's TTL tells about its owner.
type Mark uint8

// Marks of an in-progress record.
const (
	// MarkNone: nothing is known (written by an earlier version, or a
	// sealed record under store.record_format 1, whose header cannot
	// change after the claim).
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

// ClockSkew is how far apart the clocks of two sidecars may be: a record's
// Created time is the claiming sidecar's, the TTL's end is read on the
// settling one's. NTP keeps hosts within milliseconds.
const ClockSkew = 500 * time.Millisecond

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

// markSlot is the status slot of an in-progress record.
func (r *Record) markSlot() uint16 {
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

// neverForwarded reports whether r, found in progress with pttl left on
// its key at now, is a claim its owner can never have forwarded: its TTL
// was set by the claim, and the claim ran later than its owner would act
// on it (ConfirmWindow after Created, plus ClockSkew). pttl <= 0 (not
// known) never concludes.
func (r *Record) neverForwarded(pttl time.Duration, now time.Time) bool {
	if r.State != InProgress || r.Mark != MarkClaimed || r.Lease <= 0 || pttl <= 0 || r.Created.IsZero() {
		return false
	}
	ran := now.Add(pttl - r.Lease - r.Tail) // when the claim's SET ran, on this clock
	return ran.Sub(r.Created) > ConfirmWindow(r.Lease)+ClockSkew
}
