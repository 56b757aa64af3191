package contract

// The cases on clocks: who reads a claim as never forwarded, on whose
// clock, and when a claim's own round trip decides.

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// testUnforwardedReadersClock (issue 30): whether a claim was forwarded
// is decided on Redis' clock, never on the reader's. A reader whose reply
// arrives 2s late (its clock reads 2s on) still sees a claim that landed
// at once as forwarded; a claim that landed 3s after it was sent is seen
// as never forwarded by a reader whose clock is 2s behind. Before the fix
// the first read took time.Now() after the reply and freed the claim.
func testUnforwardedReadersClock(t *testing.T, d Deployment, owner claim.Backend) {
	ctx := context.Background()
	lease := 10 * time.Second
	owner.Health(ctx)
	for _, tc := range []struct {
		name   string
		late   time.Duration // how long after Created the claim's SET runs
		reader time.Duration // the reader's clock against the true time
		want   bool
	}{
		{"on time, the reply 2s late", 0, 2 * time.Second, false},
		{"on time, the reply 10s late", 0, 10 * time.Second, false},
		{"ran 3s late, the reader 2s behind", 3 * time.Second, -2 * time.Second, true},
		{"ran 1.2s late, within the window and the offset", 1200 * time.Millisecond, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := owner.Codec().Key("p", "clock", tc.name)
			rec := NewRecord(t)
			rec.Created = time.Now().Add(-tc.late)
			// Planted: an owner that got this reply would have renewed a
			// claim that ran 3s late (Forwardable) before forwarding it.
			if err := planter(t, owner).PlantUnconfirmed(ctx, key, rec, lease); err != nil {
				t.Fatalf("claim: %v", err)
			}
			reader := d.Open(t, "", claim.WithPipeline(false), claim.WithClock(func() time.Time { return time.Now().Add(tc.reader) }))
			other := NewRecord(t)
			other.Created = time.Now()
			res, err := reader.Claim(ctx, key, other, lease, claim.Quota{})
			if err != nil || res.Claimed || res.Unforwarded != tc.want {
				t.Fatalf("read: %+v %v, want Unforwarded %t", res, err, tc.want)
			}
		})
	}
}

// testUnmarkedWhileClockOff: an owner whose clock is 2s from Redis' writes
// its claims unmarked, so that no reader can ever free them early (their
// SET time cannot be compared with a Created time read on that clock);
// once its clock is back, its claims are marked again.
func testUnmarkedWhileClockOff(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	var off atomic.Int64
	off.Store(int64(2 * time.Second))
	s := d.Open(t, "test:clockoff:", claim.WithClock(func() time.Time { return time.Now().Add(time.Duration(off.Load())) }))
	s.Health(ctx)
	rec := NewRecord(t)
	rec.Created = time.Now()
	key := s.Codec().Key("p", "s", "off")
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkNone {
		t.Fatalf("a claim made 2s off Redis' clock: %+v, want MarkNone", got)
	}
	off.Store(0)
	// A measurement the first claim started in the background (its clock
	// was not known good) may still be under way with the old offset and
	// land after this one: look again until a claim is marked.
	n := 0
	poll.Until(t, "a claim made once the clock is back is marked", func() bool {
		s.Health(ctx)
		n++
		key := s.Codec().Key("p", "s", fmt.Sprint("on-", n))
		on := NewRecord(t)
		on.Created = time.Now()
		if _, err := s.Claim(ctx, key, on, 10*time.Second, claim.Quota{}); err != nil {
			t.Fatal(err)
		}
		got, _, _ := s.Get(ctx, key)
		return got != nil && got.Mark == claim.MarkClaimed
	})
}

// testOwnRoundTripDecides (issue 40): whether a claim may be forwarded
// is decided from what its own round trip read, never from the last clock
// measurement. The store measured its clock close to Redis' (the watcher),
// then a claim's SET runs, on Redis' clock, 3s after its Created time (as
// after a forward step of Redis' clock): Claim renews it before returning
// it (Renewed, MarkRenewed), so a reader never takes it for never
// forwarded, and the claims after it are unmarked until the clocks are
// measured again. A claim on time is returned as it is. Before the fix the
// late claim came back marked and a reader freed it (Unforwarded).
func testOwnRoundTripDecides(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	s := d.Open(t, fmt.Sprintf("test:own:%d:", time.Now().UnixNano()))
	s.Health(ctx)
	lease := 10 * time.Second
	onTime := NewRecord(t)
	onTime.Created = time.Now()
	key := s.Codec().Key("p", "s", "on time")
	if res, err := s.Claim(ctx, key, onTime, lease, claim.Quota{}); err != nil || !res.Claimed || res.Renewed {
		t.Fatalf("a claim on time: %+v %v, want claimed as it is", res, err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkClaimed {
		t.Fatalf("a claim on time: %+v, want MarkClaimed", got)
	}

	late := NewRecord(t)
	late.Created = time.Now().Add(-3 * time.Second)
	key = s.Codec().Key("p", "s", "late")
	res, err := s.Claim(ctx, key, late, lease, claim.Quota{Key: s.Codec().QuotaKey("p", "s"), Limit: 10, Window: time.Minute})
	if err != nil || !res.Claimed || !res.Renewed || late.Mark != claim.MarkRenewed {
		t.Fatalf("a claim whose SET ran 3s after Created: %+v %v (mark %d), want claimed and renewed", res, err, late.Mark)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkRenewed {
		t.Fatalf("its record: %+v, want MarkRenewed", got)
	}
	next := NewRecord(t)
	next.Created = time.Now()
	nextKey := s.Codec().Key("p", "s", "next")
	if _, err := s.Claim(ctx, nextKey, next, lease, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, nextKey); got == nil || got.Mark != claim.MarkNone {
		t.Fatalf("the claim after: %+v, want MarkNone until the clocks are measured again", got)

	}
	other := NewRecord(t)
	other.Created = time.Now()
	if res, err := s.Claim(ctx, key, other, lease, claim.Quota{}); err != nil || res.Claimed || res.Unforwarded {
		t.Fatalf("a retry: %+v %v, want the claim in progress, not Unforwarded", res, err)
	}
}
