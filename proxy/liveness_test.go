package proxy

import (
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// TestLivenessOnTheJudgesOwnClock (issue 53): an owner is gone only once
// this sidecar saw its claim's expiry unchanged for a whole lease of its
// own clock, with the store's clock keeping pace; a renewal (the expiry
// moves) or a step of the store's clock between the sightings starts the
// count again, and a claim read without its expiry is never judged.
func TestLivenessOnTheJudgesOwnClock(t *testing.T) {
	const lease = 2 * time.Second
	base := time.Unix(1_700_000_000, 0)
	local := base
	l := newLiveness()
	l.now = func() time.Time { return local }
	claimAt := func(expires, store time.Time) *claim.Record {
		return &claim.Record{State: claim.InProgress, Token: claim.Token{1}, Expires: expires, ReadAt: store}
	}
	exp := base.Add(time.Hour)
	see := func(store time.Time, expires time.Time) (bool, time.Duration) {
		return l.see("k", claimAt(expires, store), lease)
	}

	if gone, wait := see(base, exp); gone || wait != lease {
		t.Fatalf("first sighting: gone=%v wait=%v, want not gone, a lease to wait", gone, wait)
	}
	local = base.Add(lease / 2)
	if gone, wait := see(base.Add(lease/2), exp); gone || wait != lease/2 {
		t.Fatalf("half a lease later: gone=%v wait=%v", gone, wait)
	}
	local = base.Add(lease)
	if gone, _ := see(base.Add(lease), exp.Add(50*time.Millisecond)); !gone {
		t.Fatal("a lease later, the expiry unchanged (within the store's jitter): want gone")
	}

	// A renewal moves the expiry: the count starts again from it.
	l.forget("k")
	local = base
	see(base, exp)
	local = base.Add(lease)
	if gone, wait := see(base.Add(lease), exp.Add(lease)); gone || wait != lease {
		t.Fatalf("renewed: gone=%v wait=%v, want a new lease to wait", gone, wait)
	}
	local = base.Add(2 * lease)
	if gone, _ := see(base.Add(2*lease), exp.Add(lease)); !gone {
		t.Fatal("a lease after the renewal, unchanged since: want gone")
	}

	// The store's clock stepped between the sightings (back by about what
	// a renewal would have moved the expiry): nothing is concluded.
	l.forget("k")
	local = base
	see(base, exp)
	local = base.Add(lease)
	if gone, wait := see(base.Add(lease-time.Second), exp); gone || wait != lease {
		t.Fatalf("store's clock stepped back 1s: gone=%v wait=%v, want not judged", gone, wait)
	}
	local = base.Add(lease + 100*time.Millisecond)
	if gone, _ := see(base.Add(lease+100*time.Millisecond+10*time.Second), exp); gone {
		t.Fatal("store's clock stepped forward 10s right after a sighting: want not judged")
	}

	// Another owner's claim, and one read without its expiry.
	l.forget("k")
	local = base
	see(base, exp)
	local = base.Add(lease)
	other := claimAt(exp, base.Add(lease))
	other.Token = claim.Token{2}
	if gone, _ := l.see("k", other, lease); gone {
		t.Fatal("another owner's claim under the same key: want not judged")
	}
	if gone, _ := l.see("u", claimAt(time.Time{}, time.Time{}), lease); gone {
		t.Fatal("a claim read without its expiry: want never judged")
	}
}
