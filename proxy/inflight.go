package proxy

import (
	"sync"
	"sync/atomic"
)

// inFlight counts, per route name, the first attempts forwarding now, for
// max_in_flight. By name, so that a reload, which builds new routes, keeps
// the count of the calls still running.
type inFlight struct {
	m sync.Map // route name → *atomic.Int64
}

func (f *inFlight) counter(route string) *atomic.Int64 {
	if c, ok := f.m.Load(route); ok {
		return c.(*atomic.Int64)
	}
	c, _ := f.m.LoadOrStore(route, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// take counts one more call on route, unless limit (when positive) is
// reached: then it returns nil. The caller gives the call back with
// Add(-1) on what it returned.
func (f *inFlight) take(route string, limit int) *atomic.Int64 {
	c := f.counter(route)
	if n := c.Add(1); limit > 0 && n > int64(limit) {
		c.Add(-1)
		return nil
	}
	return c
}
