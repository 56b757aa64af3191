package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
)

// Waking waiters: every operation that settles or frees a key NOTIFYs
// channel idemproxy with the key once its write committed, when the key
// has a waiter registered (notify.go); one connection per store LISTENs, from
// the first Watch until Close, and wakes the key's waiters. Every time it
// (re)starts listening it wakes them all, so that they look at their key
// once the channel is live: a notification sent while it was down is
// never lost for good. Waiters keep a slow poll as the safety net, as
// with Redis.

// listener is a store's LISTEN connection and its waiters.
type listener struct {
	pool *pgxpool.Pool
	// dial, when set, makes the LISTEN connection (store.postgres.
	// listen_url): straight to the database, past a transaction pooler,
	// on which a LISTEN on a pooled connection never hears a NOTIFY.
	dial *pgx.ConnConfig
	// onDeaf is called, once per listener, when the listener's own probe
	// NOTIFY has not come back probeWait after it listened.
	onDeaf func()
	// probed is set once a probe came back; deafTold once onDeaf ran.
	probed, deafTold atomic.Bool
	// onUnregistered is called, once per listener, when the server
	// refused a waiter's registration (a runtime role without the rights
	// on the waiters table): waiters then wake by their poll only.
	onUnregistered   func(error)
	unregisteredTold atomic.Bool

	// register and unregister add and delete a waiter's row in the
	// waiters table (notify.go).
	register, unregister string

	mu      sync.Mutex
	waiters map[string]map[*keyWatch]struct{}
	// regs are the keys' registrations (registration), by key.
	regs   map[string]*registration
	live   bool
	cancel context.CancelFunc
	closed bool
}

// newListener is the listener of the store whose schema is schema.
func newListener(pool *pgxpool.Pool, schema string) *listener {
	l := &listener{pool: pool, waiters: map[string]map[*keyWatch]struct{}{}, regs: map[string]*registration{}}
	l.register = "INSERT INTO " + schema + ".waiters (key, id, until_ms) VALUES ($1, $2, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + $3) ON CONFLICT DO NOTHING"
	l.unregister = "DELETE FROM " + schema + ".waiters WHERE key = $1 AND id = $2"
	return l
}

// registration is this sidecar's row in the waiters table for one key,
// shared by all its waiters of that key: a thousand retries waiting for
// one hot key cost one row, written by the first and deleted after the
// last.
type registration struct {
	// ready is closed once the row was written, or could not be; id is
	// the row's, nil when it could not be written (set before ready).
	ready chan struct{}
	id    []byte
}

// keyWatch wakes a waiter when its key may have changed (claim.Watch).
type keyWatch struct {
	c   chan struct{}
	key string
	l   *listener
}

// C receives when the key may have changed.
func (w *keyWatch) C() <-chan struct{} { return w.c }

// Stop ends the watch; the last of its key's on this sidecar deletes
// their registration, in the background.
func (w *keyWatch) Stop() {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	// Nothing wakes w once it is out of waiters (wakes run under l.mu);
	// one that came before, unread, goes with it: a stopped watch is not
	// woken.
	defer w.drain()
	set := l.waiters[w.key]
	if set == nil {
		return
	}
	delete(set, w)
	if len(set) > 0 {
		return
	}
	delete(l.waiters, w.key)
	reg := l.regs[w.key]
	delete(l.regs, w.key)
	if reg != nil {
		go l.deregister(w.key, reg)
	}
}

// deregister deletes reg, key's registration, once it was written.
func (l *listener) deregister(key string, reg *registration) {
	<-reg.ready // every waiter of it returned from Watch: it is written, or never will be
	if reg.id == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), registerWait)
	defer cancel()
	_, _ = l.pool.Exec(ctx, l.unregister, key, reg.id)
}

// drain drops w's pending wake-up, if any.
func (w *keyWatch) drain() {
	select {
	case <-w.c:
	default:
	}
}

// wake sends w one pending wake-up.
func (w *keyWatch) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// Watch wakes a waiter when key may have been settled or freed, and once
// the store is listening. Before it returns, the key is registered in the
// waiters table (notify.go), so that the waiter's first read follows the
// registration: by this waiter, when it is this sidecar's first of the
// key, else by the first, whose registration it waits for. Should that
// fail or take longer than registerWait, the waiter is woken by its poll.
func (s *Store) Watch(ctx context.Context, key string) claim.Watch {
	l := s.watch
	w, reg, first := l.add(key)
	ctx, cancel := context.WithTimeout(ctx, registerWait)
	defer cancel()
	if !first {
		select {
		case <-reg.ready:
		case <-ctx.Done():
		}
		return w
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	_, err := l.pool.Exec(ctx, l.register, key, id, registeredFor.Milliseconds())
	var refused *pgconn.PgError
	switch {
	case err == nil:
		reg.id = id
	case errors.As(err, &refused) && l.onUnregistered != nil && !l.unregisteredTold.Swap(true):
		l.onUnregistered(err)
	}
	if err != nil { // the key's next waiter on this sidecar tries again
		l.mu.Lock()
		if l.regs[key] == reg {
			delete(l.regs, key)
		}
		l.mu.Unlock()
	}
	close(reg.ready)
	return w
}

// registerWait bounds a waiter's registration and its deletion;
// registeredFor is how long a registration outlives a sidecar that died
// before it deleted it (idem_expire deletes it then).
const (
	registerWait  = time.Second
	registeredFor = time.Hour
)

// add adds a waiter for key: its watch, and key's registration on this
// sidecar, which first says the caller is to write.
func (l *listener) add(key string) (w *keyWatch, reg *registration, first bool) {
	w = &keyWatch{c: make(chan struct{}, 1), key: key, l: l}
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.waiters[key]
	if set == nil {
		set = map[*keyWatch]struct{}{}
		l.waiters[key] = set
	}
	set[w] = struct{}{}
	if reg = l.regs[key]; reg == nil {
		reg, first = &registration{ready: make(chan struct{})}, true
		l.regs[key] = reg
	}
	if l.live {
		w.wake()
	} else {
		l.startLocked()
	}
	return w, reg, first
}

// start begins listening, unless the listener runs or was closed.
func (l *listener) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.startLocked()
}

// startLocked is start, l.mu held.
func (l *listener) startLocked() {
	if l.cancel == nil && !l.closed {
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel = cancel
		go l.run(ctx)
	}
}

// run listens until ctx ends, reconnecting after a failure.
func (l *listener) run(ctx context.Context) {
	for ctx.Err() == nil {
		l.listen(ctx)
		l.mu.Lock()
		l.live = false
		l.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probeWait is how long a listener waits for its own probe NOTIFY before
// it says it hears nothing.
const probeWait = 5 * time.Second

// connect is the LISTEN connection: its own (dial), or one of the pool's;
// done gives it back.
func (l *listener) connect(ctx context.Context) (conn *pgx.Conn, done func(), err error) {
	if l.dial != nil {
		c, err := pgx.ConnectConfig(ctx, l.dial)
		if err != nil {
			return nil, nil, err
		}
		return c, func() { c.Close(context.Background()) }, nil
	}
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return pc.Conn(), func() {
		pc.Conn().Close(context.Background()) // never back to the pool listening
		pc.Release()
	}, nil
}

// probe sends the listener a NOTIFY of its own through the pool (as every
// wake-up is sent) and, should it not come back within probeWait, tells
// onDeaf once: the LISTEN sits behind a transaction pooler, or the
// channel is not the pool's database's.
func (l *listener) probe(ctx context.Context, payload string) {
	if l.probed.Load() || l.onDeaf == nil {
		return
	}
	if _, err := l.pool.Exec(ctx, notifySQL, payload); err != nil {
		return // the store is down: the next listen probes again
	}
	time.AfterFunc(probeWait, func() {
		if ctx.Err() == nil && !l.probed.Load() && l.deafTold.CompareAndSwap(false, true) {
			l.onDeaf()
		}
	})
}

// listen holds one connection listening, waking waiters, until it fails
// or ctx ends.
func (l *listener) listen(ctx context.Context) {
	conn, done, err := l.connect(ctx)
	if err != nil {
		return
	}
	defer done()
	if _, err := conn.Exec(ctx, "LISTEN idemproxy"); err != nil {
		return
	}
	var nonce [8]byte
	rand.Read(nonce[:])
	payload := "probe:" + hex.EncodeToString(nonce[:])
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go l.probe(lctx, payload)
	l.mu.Lock()
	l.live = true
	for _, set := range l.waiters {
		for w := range set {
			w.wake()
		}
	}
	l.mu.Unlock()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return
		}
		if n.Payload == payload {
			l.probed.Store(true)
			continue
		}
		l.mu.Lock()
		for w := range l.waiters[n.Payload] {
			w.wake()
		}
		l.mu.Unlock()
	}
}

// ListenWith has the store LISTEN for wake-ups on a connection of its own
// made with cfg (store.postgres.listen_url) instead of one of the pool's.
// Call it before the first Watch.
func (s *Store) ListenWith(cfg *pgx.ConnConfig) { s.watch.dial = cfg }

// OnUnregisteredWaiter has refused called once, with the server's error,
// when the server refuses a waiter's registration in the waiters table
// (a runtime role without INSERT and DELETE on it): wake-ups for the
// keys it waits for are then never sent, and waiters wake by their poll.
// Call it before the first Watch.
func (s *Store) OnUnregisteredWaiter(refused func(error)) { s.watch.onUnregistered = refused }

// OnDeafListener has deaf called once when the store's LISTEN connection
// does not hear its own probe NOTIFY within 5 s of listening: wake-ups
// then never arrive, and waiters wake by their poll. Call it before the
// first Watch.
func (s *Store) OnDeafListener(deaf func()) { s.watch.onDeaf = deaf }

// close stops listening.
func (l *listener) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.cancel != nil {
		l.cancel()
	}
}
