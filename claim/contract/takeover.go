package contract

// The cases on taking a key from its owner, as they read the stored
// value: fenced on its expiry, and sparing a stream.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// Taking a claim from its owner (TakeOver, SettleOrphan) is fenced on the
// key's expiry as the caller read it (issue 53): a renewal since moves
// it, so an owner judged gone on a reading older than its last renewal
// keeps its claim, whatever Redis' clock did. A streamed record is never
// taken over, whatever it carries; FreeAbsent refuses while Redis' clock
// and the caller's disagree by more than the rules allow.
func testTakeOverFencedOnExpiry(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "expiry")
	owner := NewRecord(t)
	owner.Tail = time.Hour
	if res, err := s.Claim(ctx, key, owner, 200*time.Millisecond, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	orphaned := func() *claim.Record {
		t.Helper()
		var got *claim.Record
		poll.Until(t, "the owner's lease runs out", func() bool {
			rec, left, err := s.Get(ctx, key)
			got = rec
			return err == nil && rec != nil && rec.Orphaned(left)
		})
		if got.Expires.IsZero() || got.ReadAt.IsZero() {
			t.Fatalf("an in-progress record read without its expiry: %+v", got)
		}
		return got
	}
	stale := orphaned()
	if err := s.Renew(ctx, key, owner, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	orphaned() // orphaned again, under a later expiry
	taker := NewRecord(t)
	if _, err := s.TakeOver(ctx, key, stale, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over on an expiry read before the owner's renewal = %v, want ErrLeaseLost", err)
	}
	settler := NewRecord(t)
	if err := s.SettleOrphan(ctx, key, stale, Completed(settler, "outcome unknown"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling on an expiry read before the owner's renewal = %v, want ErrLeaseLost", err)
	}
	fresh := orphaned()
	if _, err := s.TakeOver(ctx, key, fresh, taker, time.Minute, time.Time{}); err != nil {
		t.Fatalf("taking over on the current expiry: %v", err)
	}

	// FreeAbsent from a process whose clock is a second ahead of Redis'
	// (a store of its own, its clock set before it runs anything).
	skewed := d.Open(t, "skewed:", claim.WithClock(func() time.Time { return time.Now().Add(time.Second) }))
	defer skewed.Close()
	var early *claim.TooEarlyError
	if err := skewed.FreeAbsent(ctx, key, taker.Token, time.Now().Add(-time.Hour), 0); !errors.As(err, &early) || early.Skew == 0 {
		t.Fatalf("freeing with the clocks a second apart = %v, want ErrTooEarly for the clocks", err)
	}
	if err := s.FreeAbsent(ctx, key, taker.Token, time.Now().Add(-time.Hour), 0); err != nil {
		t.Fatalf("freeing with the clocks together: %v", err)
	}

	testTakeOverSpareStreams(t, s)
}

// testTakeOverSpareStreams: a running stream is never taken over nor
// settled as an orphan, whatever headers its head carries.
func testTakeOverSpareStreams(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "streamed")
	streamer := NewRecord(t)
	if res, err := s.Claim(ctx, key, streamer, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *streamer
	head.State, head.Status = claim.Streamed, 502
	head.Header = http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-store"}, "Idempotent-Unknown-Since": {"1"}}
	if _, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TakeOver(ctx, key, &head, NewRecord(t), time.Minute, time.UnixMilli(1)); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over a streamed record = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, &head, Completed(NewRecord(t), "outcome unknown"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a streamed record = %v, want ErrLeaseLost", err)
	}
}
