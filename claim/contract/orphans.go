package contract

// The cases on claims whose owner went: a tail that outlives the lease,
// settling an orphan, claims never forwarded, and taking a key over.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// An in-progress record with a tail stays after its lease, and reports its
// lease left (not its TTL), so a finder can tell a live owner from a gone
// one; renewals keep the tail.
func testTailOutlivesLease(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	lease := 300 * time.Millisecond
	var owner *claim.Record
	key := whileLive(t, s, lease, func(key string) func() {
		owner = NewRecord(t)
		owner.Tail = time.Hour
		if res, err := s.Claim(ctx, key, owner, lease, claim.Quota{}); err != nil || !res.Claimed {
			t.Fatalf("claim = %+v, %v", res, err)
		}
		res, err := s.Claim(ctx, key, NewRecord(t), time.Second, claim.Quota{})
		renewed := s.Renew(ctx, key, owner, lease)
		return func() {
			if err != nil || res.Claimed || res.Existing.Tail != time.Hour {
				t.Fatalf("second claim = %+v, %v; want the owner's record with its tail", res, err)
			}
			if res.TTL <= 0 || res.TTL > lease || res.Existing.Orphaned(res.TTL) {
				t.Fatalf("lease left = %s, want within the %s lease, not orphaned", res.TTL, lease)
			}
			if renewed != nil {
				t.Fatal(renewed)
			}
		}
	})
	var res claim.Result
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err = s.Claim(ctx, key, NewRecord(t), time.Second, claim.Quota{})
		if err != nil || res.Claimed {
			t.Fatalf("claim after the lease = %+v, %v; want the orphaned record, kept by its tail", res, err)
		}
		if res.Existing.Orphaned(res.TTL) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never ran out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, left, err := s.Get(ctx, key)
	if err != nil || got == nil || !got.Orphaned(left) {
		t.Fatalf("Get of the orphan = %+v, %s, %v; want it orphaned", got, left, err)
	}
}

// SettleOrphan writes only over the orphan it was given, and only while
// its lease is still over.
func testSettleOrphanFenced(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	lease := 200 * time.Millisecond
	owner, settler := NewRecord(t), NewRecord(t)
	owner.Tail = time.Hour
	outcome := Completed(settler, "outcome unknown")
	key := whileLive(t, s, lease, func(key string) func() {
		if _, err := s.Claim(ctx, key, owner, lease, claim.Quota{}); err != nil {
			t.Fatal(err)
		}
		err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour)
		return func() {
			if !errors.Is(err, claim.ErrLeaseLost) {
				t.Fatalf("settling a live owner's record = %v, want ErrLeaseLost", err)
			}
		}
	})
	other := NewRecord(t)
	other.Tail = time.Hour
	poll.Until(t, "the owner's lease runs out", func() bool {
		got, left, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(left)
	})
	if err := s.SettleOrphan(ctx, key, other, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling with another record's token = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); err != nil {
		t.Fatalf("settle orphan: %v", err)
	}
	got, ttl, err := s.Get(ctx, key)
	if err != nil || got == nil || got.State != claim.Completed || got.Token != settler.Token || string(got.Body) != "outcome unknown" {
		t.Fatalf("record after settling = %+v, %v; want the settler's completed record", got, err)
	}
	if ttl < 59*time.Minute {
		t.Errorf("settled record's TTL = %s, want the retention", ttl)
	}
	// The vanished owner comes back: its completion is fenced off.
	if _, err := s.Complete(ctx, key, Completed(owner, "late"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the orphan's owner completing after the settle = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a completed record = %v, want ErrLeaseLost", err)
	}
}

// testUnforwardedClaims: a claim marks its record with its lease; one
// whose SET ran more than ConfirmWindow + ClockSkew after its Created time
// (a reply that came too late: its owner never forwarded) is reported
// Unforwarded to the next claim, and ReleaseUnforwarded frees it, fenced:
// a fresh claim is not reported, a renewed one is not either, and one
// renewed since it was read is left alone.
func testUnforwardedClaims(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	s.Health(ctx) // what the store watcher does every second: it measures the clocks, and claims are marked from now
	lease := 10 * time.Second
	keyFresh, keyGhost, keyRenewed := s.Codec().Key("p", "s", "fresh"), s.Codec().Key("p", "s", "ghost"), s.Codec().Key("p", "s", "renewed")
	other := NewRecord(t)
	other.Created = time.Now()

	fresh := NewRecord(t)
	fresh.Created = time.Now()
	if res, err := s.Claim(ctx, keyFresh, fresh, lease, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if rec, _, err := s.Get(ctx, keyFresh); err != nil || rec == nil || rec.Mark != claim.MarkClaimed || rec.Lease != lease {
		t.Fatalf("a claim's record: %+v %v, want MarkClaimed and %s", rec, err, lease)
	}
	if res, _ := s.Claim(ctx, keyFresh, other, lease, claim.Quota{}); res.Claimed || res.Unforwarded {
		t.Fatalf("a claim confirmed in time was reported %+v", res)
	}

	ghost := NewRecord(t)
	ghost.Created = time.Now().Add(-3 * time.Second) // its SET runs 3s after its owner sent it
	if err := planter(t, s).PlantUnconfirmed(ctx, keyGhost, ghost, lease); err != nil {
		t.Fatalf("claim: %v", err)
	}
	res, err := s.Claim(ctx, keyGhost, other, lease, claim.Quota{})
	if err != nil || res.Claimed || !res.Unforwarded {
		t.Fatalf("a claim that ran 3s late: %+v %v, want Unforwarded", res, err)
	}
	if err := s.ReleaseUnforwarded(ctx, keyGhost, res.Existing); err != nil {
		t.Fatalf("release unforwarded: %v", err)
	}
	if res, err := s.Claim(ctx, keyGhost, other, lease, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim after the ghost was freed: %+v %v", res, err)
	}

	renewed := NewRecord(t)
	renewed.Created = time.Now().Add(-3 * time.Second)
	if err := planter(t, s).PlantUnconfirmed(ctx, keyRenewed, renewed, lease); err != nil {
		t.Fatalf("claim: %v", err)
	}
	seen, err := s.Claim(ctx, keyRenewed, other, lease, claim.Quota{})
	if err != nil || !seen.Unforwarded {
		t.Fatalf("before the renewal: %+v %v", seen, err)
	}
	if err := s.Renew(ctx, keyRenewed, renewed, lease); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := s.Get(ctx, keyRenewed); rec.Mark != claim.MarkRenewed {
		t.Fatalf("after a renewal: mark %d, want MarkRenewed", rec.Mark)
	}
	if err := s.ReleaseUnforwarded(ctx, keyRenewed, seen.Existing); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("release of a claim renewed since it was read: %v, want ErrLeaseLost", err)
	}
	if res, _ := s.Claim(ctx, keyRenewed, other, lease, claim.Quota{}); res.Claimed || res.Unforwarded {
		t.Fatalf("a renewed claim was reported %+v", res)
	}

	testReleaseUnconfirmed(t, s, lease)
}

// testReleaseUnconfirmed: a claim whose reply never came is freed by
// ReleaseUnconfirmed, which says when there was nothing of ours.
func testReleaseUnconfirmed(t *testing.T, s claim.Backend, lease time.Duration) {
	ctx := context.Background()
	keyLost := s.Codec().Key("p", "s", "lost")
	lost := NewRecord(t)
	lost.Created = time.Now()
	if _, err := s.Claim(ctx, keyLost, lost, lease, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if found, err := s.ReleaseUnconfirmed(ctx, keyLost, lost.Token); err != nil || !found {
		t.Fatalf("release unconfirmed: %t %v, want found", found, err)
	}
	if found, err := s.ReleaseUnconfirmed(ctx, keyLost, lost.Token); err != nil || found {
		t.Fatalf("release unconfirmed again: %t %v, want not found", found, err)
	}
}

// TakeOver (issue 43) replaces an orphan only once its lease is over and
// only the orphan it was given; what it returns to judge an absent answer
// from is never earlier than the orphan's claim; the vanished owner is
// fenced off; FreeAbsent frees only the taker's claim, and only once the
// age asked for has passed on Redis' clock.
func testTakeOverFenced(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	lease := 200 * time.Millisecond
	owner, taker := NewRecord(t), NewRecord(t)
	owner.Tail, taker.Tail = time.Hour, time.Hour
	var res claim.Result
	key := whileLive(t, s, lease, func(key string) func() {
		var err error
		res, err = s.Claim(ctx, key, owner, lease, claim.Quota{})
		if err != nil || !res.Claimed || res.SetAt().IsZero() {
			t.Fatalf("claim = %+v, %v; want claimed, with its SET's time", res, err)
		}
		_, err = s.TakeOver(ctx, key, owner, taker, time.Minute, time.Time{})
		return func() {
			if !errors.Is(err, claim.ErrLeaseLost) {
				t.Fatalf("taking over a live owner's claim = %v, want ErrLeaseLost", err)
			}
		}
	})
	poll.Until(t, "the owner's lease runs out", func() bool {
		got, left, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(left)
	})
	other := NewRecord(t)
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
	if _, err := s.Complete(ctx, key, Completed(owner, "late"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
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
	testTakeOverCompleted(t, s)
}

// testTakeOverCompleted: taking over a completed record, since is the
// one given, or the store's now without one (or with one in the future).
func testTakeOverCompleted(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	taker := NewRecord(t)
	taker.Tail = time.Hour
	key := s.Codec().Key("alice", "route", "k2")
	first := NewRecord(t)
	if _, err := s.Claim(ctx, key, first, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	unknown := Completed(first, "outcome unknown")
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
	back := Completed(taker, "outcome unknown")
	if _, err := s.Complete(ctx, key, back, time.Hour); err != nil {
		t.Fatal(err)
	}
	second := NewRecord(t)
	before := time.Now().Add(-time.Second)
	if since, err := s.TakeOver(ctx, key, back, second, time.Minute, time.Now().Add(time.Hour)); err != nil || since.Before(before) || since.After(time.Now().Add(time.Second)) {
		t.Fatalf("take over with a since in the future = %s, %v; want Redis' now", since, err)
	}
}
