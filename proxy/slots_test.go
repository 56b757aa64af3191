package proxy

import "testing"

// TestFairSlots: one principal holds at most its share; principals that
// hold some leave the last share free for principals that hold none; the
// whole pool is the cap. Before issue 30 late calls had no reserve (four
// principals at a 25% share filled the pool and a fifth's slow call was
// cancelled into an outcome-unknown) and max_in_flight had no share at all.
func TestFairSlots(t *testing.T) {
	var f fairSlots
	take := func(p string, want bool, reason string) {
		t.Helper()
		ok, refused := f.take(p, 4, 2)
		if ok != want || refused != reason {
			t.Fatalf("take(%s) with %d taken: %t %q, want %t %q", p, f.count(), ok, refused, want, reason)
		}
	}
	take("alice", true, "")
	take("alice", true, "")
	take("alice", false, refusedShare) // her share is 2
	take("bob", true, "")
	take("bob", false, refusedReserved) // 3 of 4 taken: the last is kept for principals that hold none
	take("carol", true, "")             // holds none: takes it
	take("dave", false, refusedCap)     // none left at all
	f.give("alice")
	take("dave", true, "")
	f.give("bob")
	f.give("carol")
	f.give("dave")
	f.give("alice")
	if f.count() != 0 || len(f.held) != 0 {
		t.Fatalf("after giving every slot back: %d taken, %v held", f.count(), f.held)
	}

	// A share of the whole pool keeps nothing in reserve.
	var all fairSlots
	for range 4 {
		if ok, refused := all.take("alice", 4, 4); !ok {
			t.Fatalf("a 100%% share: refused %q", refused)
		}
	}

	// A slot given back twice counts once.
	var fl inFlight
	s, _ := fl.take("pay", "alice", 1, 1)
	s.give()
	s.give()
	if n := fl.slots("pay").count(); n != 0 {
		t.Fatalf("a slot given twice: %d taken", n)
	}
}
