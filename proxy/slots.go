package proxy

import (
	"math"
	"sync"
	"sync/atomic"
)

// Reasons a slot was refused, the values of the reason label of
// idemproxy_late_calls_refused_total and idemproxy_overloaded_total.
const (
	refusedCap      = "process_cap"     // every slot is taken
	refusedShare    = "principal_share" // this principal holds its whole share
	refusedReserved = "reserved"        // the last share of the slots is kept for principals that hold none
)

// fairSlots is a pool of slots shared between principals: at most max in
// all, at most share for one principal, and principals that already hold
// some leave the last share free for principals that hold none. So a few
// principals at their share cannot fill the pool: the next principal's
// first slow call still gets a slot instead of a 503 or a cancelled call.
// It is the shape of both request bounds that count calls: late calls
// (upstream.max_late_calls) and first attempts forwarding
// (max_in_flight).
type fairSlots struct {
	// mu guards n and held.
	mu   sync.Mutex
	n    int64
	held map[string]int64
}

// take reserves a slot for principal under max and share (share <= 0:
// max); when it cannot it says why.
func (f *fairSlots) take(principal string, max, share int64) (ok bool, refused string) {
	if share <= 0 || share > max {
		share = max
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	held := f.held[principal]
	switch {
	case f.n >= max:
		return false, refusedCap
	case held >= share:
		return false, refusedShare
	case held > 0 && share < max && f.n >= max-share:
		return false, refusedReserved
	}
	f.n++
	if f.held == nil {
		f.held = map[string]int64{}
	}
	f.held[principal]++
	return true, ""
}

// give returns principal's slot.
func (f *fairSlots) give(principal string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.held[principal]--; f.held[principal] <= 0 {
		delete(f.held, principal)
	}
}

// count is how many slots are taken.
func (f *fairSlots) count() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// inFlight counts, per route name, the first attempts forwarding now, for
// max_in_flight. By name, so that a reload, which builds new routes, keeps
// the count of the calls still running.
type inFlight struct {
	m sync.Map // route name → *fairSlots
}

func (f *inFlight) slots(route string) *fairSlots {
	if s, ok := f.m.Load(route); ok {
		return s.(*fairSlots)
	}
	s, _ := f.m.LoadOrStore(route, new(fairSlots))
	return s.(*fairSlots)
}

// slot is one first attempt's place in its route's count; give returns it
// once, however often it is called.
type slot struct {
	pool      *fairSlots
	principal string
	given     atomic.Bool
}

func (s *slot) give() {
	if s != nil && s.given.CompareAndSwap(false, true) {
		s.pool.give(s.principal)
	}
}

// take counts one more call of principal on route, unless limit (when
// positive) or principal's share of it is reached: then it returns nil
// and why. The caller gives it back with give.
func (f *inFlight) take(route, principal string, limit, share int) (*slot, string) {
	pool := f.slots(route)
	max := int64(limit)
	if limit <= 0 {
		max, share = math.MaxInt64, 0 // counted, never refused
	}
	if ok, refused := pool.take(principal, max, int64(share)); !ok {
		return nil, refused
	}
	return &slot{pool: pool, principal: principal}, ""
}

// lateCalls are the slots of the calls running past upstream.timeout: at
// most max in the process, at most share for one principal, and the last
// share kept for principals that hold none, so that principals parking
// slow calls cannot take every slot and turn another principal's slow
// call into a cancelled one (an unknown outcome).
type lateCalls struct {
	max, share int64
	fairSlots
}

// take reserves a late-call slot for principal.
func (l *lateCalls) take(principal string) (bool, string) {
	return l.fairSlots.take(principal, l.max, l.share)
}
