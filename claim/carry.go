package claim

import (
	"encoding/binary"
	"time"
)

// Carry is what a switch of stores (idemproxy store copy) does with one
// stored value of the old store, so that a retry after the switch gets
// what it would have got from the old store: never a second execution.
type Carry int

// How a value is carried.
const (
	// CarryForeign: not a record of ours (another version, a marker): left
	// behind.
	CarryForeign Carry = iota
	// CarrySettled: a completed record, or a stream that ended: copied as
	// it is.
	CarrySettled
	// CarryOrphan: a claim in progress whose lease is over (its owner died
	// mid-request, and what it outlives its lease by, its tail, is left):
	// copied as the claim in progress it is, its mark rewritten as a
	// renewal's (MarkRenewed), so that the new store's first retry settles
	// it as the old store's would have (outcome-unknown, or reconcile) and
	// never takes it for a claim that was never forwarded: that judgment
	// reads the old store's clock, which the new store does not share.
	CarryOrphan
	// CarryAbortedStream: a stream whose owner's lease ran out before it
	// ended: copied marked aborted, as every reader of the old store
	// already read it.
	CarryAbortedStream
	// CarryLive: a claim whose lease still runs, or a stream whose owner
	// still relays it: the drain is not over, and nothing is copied.
	CarryLive
)

func (c Carry) String() string {
	switch c {
	case CarrySettled:
		return "settled"
	case CarryOrphan:
		return "orphan"
	case CarryAbortedStream:
		return "aborted stream"
	case CarryLive:
		return "live"
	}
	return "foreign"
}

// CarryValue says how the stored value v, with ttl left of its key's
// life, read when the old store's clock said nowMS (Unix ms), is carried
// into a new store, and the bytes to write there (v itself, or a copy with
// the changes the kind says). It reads only the fixed header, so it works
// on sealed records too (a seal covers the response part, never the
// bytes it changes: renewals and aborts rewrite them in place as well).
func CarryValue(v []byte, ttl time.Duration, nowMS int64) (Carry, []byte) {
	if len(v) < headerLen || v[offVersion] != version || ttl <= 0 {
		return CarryForeign, nil
	}
	switch State(v[offState]) {
	case Completed:
		return CarrySettled, v
	case InProgress:
		var tail time.Duration
		if v[offFlags]&flagTail != 0 {
			tail = time.Duration(binary.BigEndian.Uint64(v[offCompleted:])) * time.Millisecond
		}
		if ttl > tail {
			return CarryLive, nil
		}
		out := v
		if m := Mark(binary.BigEndian.Uint16(v[offStatus:]) >> markShift); m == MarkClaimed {
			out = append([]byte(nil), v...)
			out[offStatus] += 1 << (markShift - 8) // 01 → 10, as a renewal rewrites it
		}
		return CarryOrphan, out
	case Streamed:
		if len(v) < streamPrefix {
			return CarryForeign, nil
		}
		end, _ := StreamState(string(v[:streamPrefix]), nowMS)
		switch {
		case StreamEnd(v[offStreamEnd]) != StreamRunning:
			return CarrySettled, v
		case end == StreamAborted:
			out := append([]byte(nil), v...)
			out[offStreamEnd] = byte(StreamAborted)
			return CarryAbortedStream, out
		}
		return CarryLive, nil
	}
	return CarryForeign, nil
}
