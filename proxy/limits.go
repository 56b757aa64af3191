package proxy

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Limits. A process bounds three things its requests hold, each the same
// way: a total for the process, a share one principal may hold, and,
// for calls, the last share kept for principals that hold none, so that a
// few principals at their share cannot take everything from the rest.
//
//	what                                counted in  bound (config)                                refused as
//	request and answer buffers          bytes       limits.max_buffered_bytes, .principal_share   503 buffers-full, 429 too-many-bytes
//	first attempts forwarding, a route  calls       defaults.max_in_flight, ..._principal_share   503 overloaded, the claim released
//	late calls (past upstream.timeout)  calls       upstream.max_late_calls, ..._principal_share  the call cancelled at the timeout
//
// Each is a held: take under a bound, give back what was taken. A new
// bound is one more held and one more row here (and in
// docs/configuration.md, "Bounds").

// bound is what a held allows: max in all, share for one principal (0 or
// more than max: max), and with reserve, principals that hold some leave
// the last share free for principals that hold none.
type bound struct {
	max, share int64
	reserve    bool
	// minReserve, with reserve, is the least kept for principals that
	// hold none when it is more than the share.
	minReserve int64
}

// principalMax is the most one principal may hold: the share, or max when
// the share is unset or larger.
func (b bound) principalMax() int64 {
	if b.share <= 0 || b.share > b.max {
		return b.max
	}
	return b.share
}

// unbounded counts without refusing.
var unbounded = bound{max: math.MaxInt64}

// held is what principals hold of one resource.
type held struct {
	n  atomic.Int64 // in all
	mu sync.Mutex   // guards by
	by map[string]int64
}

// take adds amount for principal within b, or reserves nothing and says
// why not.
func (h *held) take(principal string, amount int64, b bound) (refused string) {
	share := b.principalMax()
	h.mu.Lock()
	defer h.mu.Unlock()
	mine, n := h.by[principal], h.n.Load()
	switch {
	case n+amount > b.max:
		return refusedCap
	case mine+amount > share:
		return refusedShare
	case b.reserve && mine > 0 && share < b.max && n+amount > b.max-max(share, b.minReserve):
		return refusedReserved
	}
	h.addLocked(principal, amount)
	return ""
}

// force adds amount for principal whatever the bound.
func (h *held) force(principal string, amount int64) {
	h.mu.Lock()
	h.addLocked(principal, amount)
	h.mu.Unlock()
}

// move makes amount of what from holds to's, within to's share of b (the
// total is unchanged).
func (h *held) move(from, to string, amount int64, b bound) (refused string) {
	share := b.principalMax()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by[to]+amount > share {
		return refusedShare
	}
	h.addLocked(from, -amount)
	h.addLocked(to, amount)
	return ""
}

// give returns amount of what principal holds.
func (h *held) give(principal string, amount int64) {
	h.mu.Lock()
	h.addLocked(principal, -amount)
	h.mu.Unlock()
}

func (h *held) addLocked(principal string, amount int64) {
	h.n.Add(amount)
	if h.by == nil {
		h.by = map[string]int64{}
	}
	if v := h.by[principal] + amount; v > 0 {
		h.by[principal] = v
	} else {
		delete(h.by, principal)
	}
}

// count is what is held in all.
func (h *held) count() int64 { return h.n.Load() }

// budget bounds the bytes this process holds in request and response
// buffers, so that many clients declaring large bodies and trickling them
// cannot run it out of memory (an OOM kill puts every tenant's claims in
// flight into the dual-write window), and one principal's share of it, so
// that one tenant cannot take it all from the others. A limit of 0 holds
// without limit.
type budget struct {
	counts       held
	limit, share int64
}

// Errors reading a request body returns when holding more of it would
// exceed the budget, or the principal's share of it.
var (
	errOverBudget = errors.New("proxy: request buffers are at limits.max_buffered_bytes")
	errOverShare  = errors.New("proxy: this principal's request buffers are at its share of limits.max_buffered_bytes")
)

// take reserves n bytes for principal, and reports why not, reserving
// nothing, when that would exceed the limit or the principal's share.
// Without a limit (the default) only the total is counted, with no lock:
// a budget's limit never changes (a reload builds a new Handler).
func (b *budget) take(principal string, n int) error {
	if b.limit <= 0 {
		b.counts.n.Add(int64(n))
		return nil
	}
	switch b.counts.take(principal, int64(n), bound{max: b.limit, share: b.share}) {
	case "":
		return nil
	case refusedShare:
		return errOverShare
	default:
		return errOverBudget
	}
}

// force reserves n bytes whatever the limit: an upstream's answer must be
// read whole to be stored, since the upstream has already acted.
func (b *budget) force(principal string, n int) {
	if b.limit <= 0 {
		b.counts.n.Add(int64(n))
		return
	}
	b.counts.force(principal, int64(n))
}

// move makes n bytes from holds to's (a webhook delivery's, once its
// signature verified), unless that exceeds to's share.
func (b *budget) move(from, to string, n int) error {
	if b.limit <= 0 {
		return nil
	}
	if b.counts.move(from, to, int64(n), bound{max: b.limit, share: b.share}) != "" {
		return errOverShare
	}
	return nil
}

func (b *budget) give(principal string, n int) {
	if b.limit <= 0 {
		b.counts.n.Add(-int64(n))
		return
	}
	b.counts.give(principal, int64(n))
}

// inFlight counts, per route name, the first attempts forwarding now, for
// max_in_flight. By name, so that a reload, which builds new routes, keeps
// the count of the calls still running.
type inFlight struct {
	m sync.Map // route name → *held
}

func (f *inFlight) route(route string) *held {
	if h, ok := f.m.Load(route); ok {
		return h.(*held)
	}
	h, _ := f.m.LoadOrStore(route, new(held))
	return h.(*held)
}

// slot is one first attempt's place in its route's count; give returns it
// once, however often it is called.
type slot struct {
	held      *held
	principal string
	given     atomic.Bool
}

func (s *slot) give() {
	if s != nil && s.given.CompareAndSwap(false, true) {
		s.held.give(s.principal, 1)
	}
}

// take counts one more call of principal on route, unless limit (when
// positive) or principal's share of it is reached: then it returns nil
// and why. The caller gives it back with give.
func (f *inFlight) take(route, principal string, limit, share int) (*slot, string) {
	h := f.route(route)
	b := unbounded // counted, never refused
	if limit > 0 {
		b = bound{max: int64(limit), share: int64(share), reserve: true}
	}
	if refused := h.take(principal, 1, b); refused != "" {
		return nil, refused
	}
	return &slot{held: h, principal: principal}, ""
}

// lateCalls are the slots of the calls running past upstream.timeout: at
// most max in the process (0: none), at most share for one principal, and
// the last half of the pool (or the last share, when larger) kept for
// principals that hold none, so that principals parking slow calls cannot
// take every slot and turn another principal's slow call into a cancelled
// one (an unknown outcome). With only the last share kept, (max - share) /
// share principals at their share plus share newcomers filled the pool (5
// at max 8, share 2); with half kept, at least max/2 + (max/2)/share
// principals always find a slot (6 at max 8 and a 25% share, 34 at 64),
// and principals holding one call each can use every slot. A share of the
// whole pool keeps nothing.
type lateCalls struct {
	counts     held
	max, share int64
}

// take reserves a late-call slot for principal.
func (l *lateCalls) take(principal string) (bool, string) {
	refused := l.counts.take(principal, 1, bound{max: l.max, share: l.share, reserve: true, minReserve: (l.max + 1) / 2})
	return refused == "", refused
}

func (l *lateCalls) give(principal string) { l.counts.give(principal, 1) }

// attached counts the retries following each stream on this sidecar.
type attached struct {
	mu sync.Mutex
	// n counts followers by stream key, p by principal; mu guards both.
	n, p map[string]int
}

// take counts one more follower of key for principal, or reports false
// when the stream, or the principal across its streams, has maxAttached
// already on this sidecar.
func (a *attached) take(key, principal string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n, a.p = map[string]int{}, map[string]int{}
	}
	if a.n[key] >= maxAttached || a.p[principal] >= maxAttached {
		return false
	}
	a.n[key]++
	a.p[principal]++
	return true
}

func (a *attached) give(key, principal string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n[key]--; a.n[key] <= 0 {
		delete(a.n, key)
	}
	if a.p[principal]--; a.p[principal] <= 0 {
		delete(a.p, principal)
	}
}

// claimAges is the Handler's registry of its in-flight owners, each by
// the cancel function of its upstream call (the owner's own field, so one
// per owner): Abandon cancels their calls, and the gauges read their
// number and the age of the oldest (a claim held far past the upstream
// timeout means a stuck upstream call or a bug, and is worth an alert).
type claimAges struct {
	mu      sync.Mutex // guards started
	started map[*context.CancelCauseFunc]time.Time
	now     func() time.Time
}

func (c *claimAges) add(cancel *context.CancelCauseFunc) {
	c.mu.Lock()
	c.started[cancel] = c.now()
	c.mu.Unlock()
}

func (c *claimAges) remove(cancel *context.CancelCauseFunc) {
	c.mu.Lock()
	delete(c.started, cancel)
	c.mu.Unlock()
}

// each calls f with the cancel function of every in-flight claim's
// upstream call, under the lock: f must not block.
func (c *claimAges) each(f func(cancel context.CancelCauseFunc)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cancel := range c.started {
		f(*cancel)
	}
}

func (c *claimAges) count() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return float64(len(c.started))
}

func (c *claimAges) oldest() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, t := range c.started {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if first.IsZero() {
		return 0
	}
	return c.now().Sub(first).Seconds()
}
