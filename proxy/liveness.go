package proxy

import (
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Liveness is judged on this process's own clock (DESIGN, sixth-round
// decisions). A claim whose key's TTL fell under its tail looks orphaned
// on the store's clock, and so does a live owner's claim right after that
// clock stepped forward: the step lowers every TTL at once. So nothing
// here takes a claim from its owner, or settles it, on what the store's
// clock says alone: a sidecar first sees the claim, then sees it again a
// full lease later on its monotonic clock, and only if the owner showed
// no sign of life in between is the owner gone.
//
// A sign of life is a change of the key's expiry on the store's clock
// (claim.Record.Expires): every renewal moves it, this version's and
// v0.6.0's alike, and no step of the store's clock does, since Redis and
// Postgres keep an absolute expiry time. So an expiry unchanged for a
// lease means no renewal for a lease, unless the store's clock was also
// stepped back by about as much as the owner renewed: the store's clock
// must then also have kept pace with this one between the two sightings
// (within maxStoreSkew), or nothing is concluded and the sighting starts
// again.

// maxSightings bounds what a sidecar remembers of claims it saw in
// progress; beyond it, an arbitrary sighting is forgotten (its key then
// waits one more lease before it can be judged).
const maxSightings = 8192

// maxStoreSkew is how far the store's clock may drift from this one
// between two sightings of a claim for them to count as a lease without
// a sign of life: the offset the never-forwarded rule allows.
const maxStoreSkew = 500 * time.Millisecond

// sighting is one in-progress claim as this sidecar saw it.
type sighting struct {
	token claim.Token
	// expires is the key's expiry and storeNow the store's clock, both as
	// one round trip read them.
	expires, storeNow time.Time
	// at is this process's clock when the claim was first seen with this
	// expiry (monotonic).
	at time.Time
}

// liveness remembers the in-progress claims this sidecar saw, by key.
type liveness struct {
	// now is this process's clock; time.Now (with its monotonic reading).
	now func() time.Time
	mu  sync.Mutex
	// seen guards nothing else; it is guarded by mu.
	seen map[string]sighting
}

func newLiveness() *liveness {
	return &liveness{now: time.Now, seen: make(map[string]sighting)}
}

// see notes rec, an in-progress claim under key whose key expires at
// rec.Expires, read when the store's clock said rec.ReadAt, and reports
// whether its owner is gone: this sidecar saw the same claim with the
// same expiry a full lease ago or longer, and the store's clock kept pace
// with this one meanwhile. Otherwise it returns how long, at least, until
// it can tell. A claim read without its expiry or the store's clock is
// never judged.
func (l *liveness) see(key string, rec *claim.Record, lease time.Duration) (gone bool, wait time.Duration) {
	storeNow := rec.ReadAt
	if rec.Expires.IsZero() || storeNow.IsZero() {
		return false, lease
	}
	cur := sighting{token: rec.Token, expires: rec.Expires, storeNow: storeNow, at: l.now()}
	now := cur.at
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.seen[key]
	if !ok || s.token != rec.Token || !claim.SameExpiry(s.expires, rec.Expires) {
		l.remember(key, cur)
		return false, lease
	}
	elapsed := now.Sub(s.at)
	if elapsed < lease {
		return false, lease - elapsed
	}
	if skew := storeNow.Sub(s.storeNow) - elapsed; skew > maxStoreSkew || skew < -maxStoreSkew {
		// The store's clock stepped between the sightings: a renewal may
		// hide behind it. Look again for a whole lease.
		l.seen[key] = cur
		return false, lease
	}
	return true, 0
}

// forget drops what was seen of key: its claim was settled, taken over or
// freed.
func (l *liveness) forget(key string) {
	l.mu.Lock()
	delete(l.seen, key)
	l.mu.Unlock()
}

// remember stores s for key, making room first when full.
func (l *liveness) remember(key string, s sighting) {
	if _, ok := l.seen[key]; !ok && len(l.seen) >= maxSightings {
		for k := range l.seen { // an arbitrary one: map order
			delete(l.seen, k)
			break
		}
	}
	l.seen[key] = s
}

// orphans remembers, on this sidecar's monotonic clock, when it first saw
// each key left by a first attempt whose outcome is unknown (an orphaned
// claim, or a stored outcome-unknown) on a reconcile route: "absent" frees
// such a key only once this sidecar has itself seen it so for
// absent_after. The wall clocks (the claimer's, this sidecar's, the
// store's) can all step together, when the store and this sidecar share a
// host or a time source; this clock cannot, so no step of any shared
// clock frees a key early. The cost: an absent verdict waits up to
// absent_after after the first retry this sidecar sees.
type orphans struct {
	// now is this process's clock; time.Now (with its monotonic reading).
	now func() time.Time
	mu  sync.Mutex
	// first is guarded by mu: when each key was first seen orphaned.
	first map[string]time.Time
}

func newOrphans() *orphans {
	return &orphans{now: time.Now, first: make(map[string]time.Time)}
}

// see notes that key was seen orphaned now, unless it was before.
func (o *orphans) see(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.first[key]; ok {
		return
	}
	if len(o.first) >= maxSightings {
		for k := range o.first { // an arbitrary one: its key waits again
			delete(o.first, k)
			break
		}
	}
	o.first[key] = o.now()
}

// left is how much longer than now key must have been seen orphaned for
// it to have been so for age; age itself when it was never seen.
func (o *orphans) left(key string, age time.Duration) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	first, ok := o.first[key]
	if !ok {
		return age
	}
	return age - o.now().Sub(first)
}

// forget drops key: it was freed or settled with the upstream's answer.
func (o *orphans) forget(key string) {
	o.mu.Lock()
	delete(o.first, key)
	o.mu.Unlock()
}
