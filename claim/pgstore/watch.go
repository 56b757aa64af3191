package pgstore

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
)

// Waking waiters: every operation that settles or frees a key NOTIFYs
// channel idemproxy with the key once its write committed (notify.go); one connection per store LISTENs, from
// the first Watch until Close, and wakes the key's waiters. Every time it
// (re)starts listening it wakes them all, so that they look at their key
// once the channel is live: a notification sent while it was down is
// never lost for good. Waiters keep a slow poll as the safety net, as
// with Redis.

// listener is a store's LISTEN connection and its waiters.
type listener struct {
	pool *pgxpool.Pool

	mu      sync.Mutex
	waiters map[string]map[*keyWatch]struct{}
	live    bool
	cancel  context.CancelFunc
	closed  bool
}

func newListener(pool *pgxpool.Pool) *listener {
	return &listener{pool: pool, waiters: map[string]map[*keyWatch]struct{}{}}
}

// keyWatch wakes a waiter when its key may have changed (claim.Watch).
type keyWatch struct {
	c   chan struct{}
	key string
	l   *listener
}

// C receives when the key may have changed.
func (w *keyWatch) C() <-chan struct{} { return w.c }

// Stop ends the watch.
func (w *keyWatch) Stop() {
	w.l.mu.Lock()
	defer w.l.mu.Unlock()
	if set := w.l.waiters[w.key]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(w.l.waiters, w.key)
		}
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
// the store is listening.
func (s *Store) Watch(_ context.Context, key string) claim.Watch {
	l := s.watch
	w := &keyWatch{c: make(chan struct{}, 1), key: key, l: l}
	l.mu.Lock()
	defer l.mu.Unlock()
	set := l.waiters[key]
	if set == nil {
		set = map[*keyWatch]struct{}{}
		l.waiters[key] = set
	}
	set[w] = struct{}{}
	switch {
	case l.live:
		w.wake()
	case l.cancel == nil && !l.closed:
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel = cancel
		go l.run(ctx)
	}
	return w
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

// listen holds one connection listening, waking waiters, until it fails
// or ctx ends.
func (l *listener) listen(ctx context.Context) {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN idemproxy"); err != nil {
		conn.Conn().Close(context.Background()) // not back to the pool half-listening
		return
	}
	l.mu.Lock()
	l.live = true
	for _, set := range l.waiters {
		for w := range set {
			w.wake()
		}
	}
	l.mu.Unlock()
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			conn.Conn().Close(context.Background())
			return
		}
		l.mu.Lock()
		for w := range l.waiters[n.Payload] {
			w.wake()
		}
		l.mu.Unlock()
	}
}

// close stops listening.
func (l *listener) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.cancel != nil {
		l.cancel()
	}
}
