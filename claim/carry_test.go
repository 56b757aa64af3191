package claim

import (
	"encoding/binary"
	"testing"
	"time"
)

// TestCarryValue (issue 62): a switch of stores carries every record of
// ours: settled ones as they are, an orphan as a claim that a renewal
// marked (never "never forwarded" on the new store's clock), a stream
// whose owner died as aborted; a claim or a stream still live is reported
// so, and nothing of it is copied.
func TestCarryValue(t *testing.T) {
	c := NewCodec("idem:")
	const key = "idem:k"
	now := time.UnixMilli(1_700_000_000_000)
	lease, tail := 10*time.Second, 24*time.Hour
	claimed := &Record{State: InProgress, Created: now, Tail: tail, Mark: MarkClaimed, Lease: lease}
	claimed.Token[0] = 7
	done := &Record{State: Completed, Created: now, Completed: now, Status: 201, Body: []byte("ok")}
	stream := func(leaseEnd int64, end StreamEnd) []byte {
		v := c.StreamHead(key, &Record{State: Streamed, Created: now, Status: 200})
		binary.BigEndian.PutUint64(v[offCompleted:], uint64(leaseEnd))
		v[offStreamEnd] = byte(end)
		return append(v, "data: 1\n\n"...)
	}
	nowMS := now.UnixMilli()
	for _, tc := range []struct {
		name string
		v    []byte
		ttl  time.Duration
		want Carry
	}{
		{"completed", c.Encode(key, done), time.Hour, CarrySettled},
		{"claim, lease running", c.Encode(key, claimed), tail + lease/2, CarryLive},
		{"claim, lease over", c.Encode(key, claimed), tail - time.Second, CarryOrphan},
		{"claim without a tail (keep), lease running", c.Encode(key, &Record{State: InProgress, Created: now}), time.Second, CarryLive},
		{"stream ended", stream(nowMS-1000, StreamEnded), time.Hour, CarrySettled},
		{"stream running", stream(nowMS+1000, StreamRunning), time.Hour, CarryLive},
		{"stream whose owner died", stream(nowMS-1000, StreamRunning), time.Hour, CarryAbortedStream},
		{"expired", c.Encode(key, done), 0, CarryForeign},
		{"another version", append([]byte{9}, c.Encode(key, done)[1:]...), time.Hour, CarryForeign},
		{"a marker", []byte("1700000000000000"), time.Hour, CarryForeign},
	} {
		got, out := CarryValue(tc.v, tc.ttl, nowMS)
		if got != tc.want {
			t.Errorf("%s: carried as %v, want %v", tc.name, got, tc.want)
			continue
		}
		switch got {
		case CarrySettled:
			if string(out) != string(tc.v) {
				t.Errorf("%s: settled bytes changed", tc.name)
			}
		case CarryOrphan:
			rec, err := c.Open(key, out)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if rec.Mark != MarkRenewed || rec.Tail != tail || rec.Token != claimed.Token {
				t.Errorf("%s: carried as mark %v tail %v token %x, want a renewed mark, the tail and the token kept", tc.name, rec.Mark, rec.Tail, rec.Token[:2])
			}
			if orig, _ := c.Open(key, tc.v); orig.Mark != MarkClaimed {
				t.Errorf("%s: the old store's value was changed in place", tc.name)
			}
		case CarryAbortedStream:
			end, ok := StreamState(string(out[:streamPrefix]), nowMS-10_000)
			if !ok || end != StreamAborted {
				t.Errorf("%s: carried as %v, want aborted on any clock", tc.name, end)
			}
			if len(out) != len(tc.v) {
				t.Errorf("%s: the stored prefix changed length", tc.name)
			}
		}
	}
}
