package claim_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// TakeOver (issue 43) replaces an orphan only once its lease is over and
// only the orphan it was given; what it returns to judge an absent answer
// from is never earlier than the orphan's claim; the vanished owner is
// fenced off; FreeAbsent frees only the taker's claim, and only once the
// age asked for has passed on Redis' clock.
func testTakeOverFenced(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	owner := newRecord(t)
	owner.Tail = time.Hour
	res, err := s.Claim(ctx, key, owner, 200*time.Millisecond, claim.Quota{})
	if err != nil || !res.Claimed || res.SetAt().IsZero() {
		t.Fatalf("claim = %+v, %v; want claimed, with its SET's time", res, err)
	}
	taker := newRecord(t)
	taker.Tail = time.Hour
	if _, err := s.TakeOver(ctx, key, owner, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over a live owner's claim = %v, want ErrLeaseLost", err)
	}
	poll.Until(t, "the owner's lease runs out", func() bool {
		got, left, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(left)
	})
	other := newRecord(t)
	if _, err := s.TakeOver(ctx, key, other, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over with another record's token = %v, want ErrLeaseLost", err)
	}
	since, err := s.TakeOver(ctx, key, owner, taker, time.Minute, time.Time{})
	if err != nil {
		t.Fatalf("take over: %v", err)
	}
	if since.Before(res.SetAt().Truncate(time.Millisecond)) {
		t.Errorf("since %s is before the orphan's claim at %s: an absent answer could be believed early", since, res.SetAt())
	}
	if _, err := s.Complete(ctx, key, completed(owner, "late"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the vanished owner completing after the take-over = %v, want ErrLeaseLost", err)
	}
	var early *claim.TooEarlyError
	if err := s.FreeAbsent(ctx, key, taker.Token, since, time.Hour); !errors.As(err, &early) || early.Left < 59*time.Minute {
		t.Fatalf("freeing before the age = %v, want ErrTooEarly with about an hour left", err)
	}
	if err := s.FreeAbsent(ctx, key, owner.Token, since, 0); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("freeing with the old owner's token = %v, want ErrLeaseLost", err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Token != taker.Token {
		t.Fatalf("after refused frees: %+v, want the taker's claim", got)
	}
	if err := s.FreeAbsent(ctx, key, taker.Token, since, 0); err != nil {
		t.Fatalf("free absent: %v", err)
	}
	if got, _, _ := s.Get(ctx, key); got != nil {
		t.Fatalf("after the free: %+v, want the key gone", got)
	}

	// A completed record: since is the one given, or Redis' now without one
	// (or with one in the future).
	key = s.Key("alice", "route", "k2")
	first := newRecord(t)
	if _, err := s.Claim(ctx, key, first, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	unknown := completed(first, "outcome unknown")
	if _, err := s.Complete(ctx, key, unknown, time.Hour); err != nil {
		t.Fatal(err)
	}
	given := time.Now().Add(-10 * time.Minute).Truncate(time.Millisecond)
	if since, err := s.TakeOver(ctx, key, unknown, taker, time.Minute, given); err != nil || !since.Equal(given) {
		t.Fatalf("take over a completed record = %s, %v; want %s", since, err, given)
	}
	if _, err := s.Complete(ctx, key, unknown, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the completed record's writer again = %v, want ErrLeaseLost", err)
	}
	back := completed(taker, "outcome unknown")
	if _, err := s.Complete(ctx, key, back, time.Hour); err != nil {
		t.Fatal(err)
	}
	second := newRecord(t)
	before := time.Now().Add(-time.Second)
	if since, err := s.TakeOver(ctx, key, back, second, time.Minute, time.Now().Add(time.Hour)); err != nil || since.Before(before) || since.After(time.Now().Add(time.Second)) {
		t.Fatalf("take over with a since in the future = %s, %v; want Redis' now", since, err)
	}
}

// Taking a claim from its owner (TakeOver, SettleOrphan) is fenced on the
// key's expiry as the caller read it (issue 53): a renewal since moves
// it, so an owner judged gone on a reading older than its last renewal
// keeps its claim, whatever Redis' clock did. A streamed record is never
// taken over, whatever it carries; FreeAbsent refuses while Redis' clock
// and the caller's disagree by more than the rules allow.
func testTakeOverFencedOnExpiry(t *testing.T, c redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "expiry")
	owner := newRecord(t)
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
	taker := newRecord(t)
	if _, err := s.TakeOver(ctx, key, stale, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over on an expiry read before the owner's renewal = %v, want ErrLeaseLost", err)
	}
	settler := newRecord(t)
	if err := s.SettleOrphan(ctx, key, stale, completed(settler, "outcome unknown"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling on an expiry read before the owner's renewal = %v, want ErrLeaseLost", err)
	}
	fresh := orphaned()
	if _, err := s.TakeOver(ctx, key, fresh, taker, time.Minute, time.Time{}); err != nil {
		t.Fatalf("taking over on the current expiry: %v", err)
	}

	// FreeAbsent from a process whose clock is a second ahead of Redis'
	// (a store of its own, its clock set before it runs anything).
	skewed := claim.New(c, "skewed:")
	claim.SetClock(skewed, func() time.Time { return time.Now().Add(time.Second) })
	defer skewed.Close()
	var early *claim.TooEarlyError
	if err := skewed.FreeAbsent(ctx, key, taker.Token, time.Now().Add(-time.Hour), 0); !errors.As(err, &early) || early.Skew == 0 {
		t.Fatalf("freeing with the clocks a second apart = %v, want ErrTooEarly for the clocks", err)
	}
	if err := s.FreeAbsent(ctx, key, taker.Token, time.Now().Add(-time.Hour), 0); err != nil {
		t.Fatalf("freeing with the clocks together: %v", err)
	}

	// A running stream, whatever headers its head carries.
	key = s.Key("alice", "route", "streamed")
	streamer := newRecord(t)
	if res, err := s.Claim(ctx, key, streamer, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *streamer
	head.State, head.Status = claim.Streamed, 502
	head.Header = http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-store"}, "Idempotent-Unknown-Since": {"1"}}
	if _, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TakeOver(ctx, key, &head, newRecord(t), time.Minute, time.UnixMilli(1)); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over a streamed record = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, &head, completed(newRecord(t), "outcome unknown"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a streamed record = %v, want ErrLeaseLost", err)
	}
}
