package proxy

import "testing"

// TestFairSlots: one principal holds at most its share; principals that
// hold some leave the last share free for principals that hold none; the
// whole pool is the cap. Before issue 30 late calls had no reserve (four
// principals at a 25% share filled the pool and a fifth's slow call was
// cancelled into an outcome-unknown) and max_in_flight had no share at all.
func TestFairSlots(t *testing.T) {
	f := lateCalls{max: 4, share: 2}
	take := func(p string, want bool, reason string) {
		t.Helper()
		ok, refused := f.take(p)
		if ok != want || refused != reason {
			t.Fatalf("take(%s) with %d taken: %t %q, want %t %q", p, f.counts.count(), ok, refused, want, reason)
		}
	}
	take("alice", true, "")
	take("alice", true, "")
	take("alice", false, refusedShare) // her share is 2
	take("bob", true, "")
	take("bob", false, refusedReserved) // 3 of 4 taken: the last half is kept for principals that hold none
	take("carol", true, "")             // holds none: takes it
	take("dave", false, refusedCap)     // none left at all
	f.give("alice")
	take("dave", true, "")
	f.give("bob")
	f.give("carol")
	f.give("dave")
	f.give("alice")
	if f.counts.count() != 0 || len(f.counts.by) != 0 {
		t.Fatalf("after giving every slot back: %d taken, %v held", f.counts.count(), f.counts.by)
	}

	// However principals within their share arrive, as many principals
	// as the issue asks for (issue 40: 5 at max 8; 1/share + 2) each find
	// a late-call slot: each takes its whole share before the next comes,
	// the order that leaves the fewest slots for later principals. Before,
	// only the last share was kept and a sixth principal (the fifth at
	// max 8, share 2, after three at their share) found none.
	for _, tc := range []struct{ max, share, want int64 }{{8, 2, 5}, {8, 2, 6}, {8, 4, 4}, {64, 16, 6}, {64, 16, 34}, {100, 10, 12}} {
		l := lateCalls{max: tc.max, share: tc.share}
		served := int64(0)
		for p := int64(0); ; p++ {
			name := string(rune('a'+p%26)) + string(rune('0'+p/26))
			ok, _ := l.take(name)
			if !ok {
				break
			}
			served++
			for range tc.share - 1 {
				if ok, _ := l.take(name); !ok {
					break
				}
			}
		}
		if served < tc.want {
			t.Errorf("late calls, max %d, share %d: %d principals found a slot, want at least %d", tc.max, tc.share, served, tc.want)
		}
	}

	// A share of the whole pool keeps nothing in reserve.
	all := lateCalls{max: 4, share: 4}
	for range 4 {
		if ok, refused := all.take("alice"); !ok {
			t.Fatalf("a 100%% share: refused %q", refused)
		}
	}

	// A slot given back twice counts once.
	var fl inFlight
	s, _ := fl.take("pay", "alice", 1, 1)
	s.give()
	s.give()
	if n := fl.route("pay").count(); n != 0 {
		t.Fatalf("a slot given twice: %d taken", n)
	}
}

// The byte budget is the same shape: a total and one principal's share,
// checked before anything is reserved; forced bytes (an answer the
// upstream already gave) count whatever the bound; 0 holds without limit.
func TestBudget(t *testing.T) {
	b := budget{limit: 100, share: 60}
	if err := b.take("alice", 60); err != nil {
		t.Fatal(err)
	}
	if err := b.take("alice", 1); err != errOverShare {
		t.Fatalf("alice past her share: %v, want errOverShare", err)
	}
	if err := b.take("bob", 41); err != errOverBudget {
		t.Fatalf("bob past the total: %v, want errOverBudget", err)
	}
	if err := b.take("bob", 40); err != nil {
		t.Fatal(err)
	}
	b.force("bob", 1000)
	if b.counts.count() != 1100 {
		t.Fatalf("held %d, want 1100", b.counts.count())
	}
	b.give("bob", 1040)
	b.give("alice", 60)
	if b.counts.count() != 0 || len(b.counts.by) != 0 {
		t.Fatalf("after giving everything back: %d, %v", b.counts.count(), b.counts.by)
	}
	var free budget
	if err := free.take("alice", 1<<40); err != nil || free.counts.count() != 1<<40 {
		t.Fatalf("no limit: %v, %d held", err, free.counts.count())
	}
}
