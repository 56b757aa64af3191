package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Claims that provably wrote nothing. A claim whose reply never came may
// still run in Redis, so its owner cleans it up in the background; but
// while Redis refuses connections (an outage, a restart) that would queue
// one cleanup per request, each retried for the lease and more, all for
// claims that were never sent. A claim wrote nothing when its client had
// no connection, idle or busy, when it began, and made none before it
// failed: no byte of it can have left the process. go-redis retries
// within one call, but every attempt needs a connection, and none was
// there. The check is conservative: a connection made for anything else
// meanwhile counts as one this claim may have used.

// dialCounter counts successful dials, and remembers the last failed
// one since (unavailable names it): a go-redis hook.
type dialCounter struct{ s *Store }

func (d dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			d.s.dials.Add(1)
			d.s.dialErr.Store(nil)
		} else if ctx.Err() == nil {
			d.s.dialErr.Store(&failedDial{err: err, at: time.Now()})
		}
		return c, err
	}
}

// failedDial is a connection attempt that failed, and when.
type failedDial struct {
	err error
	at  time.Time
}

// noConnection is a call that gave up at its deadline while every
// connection attempt failed: its message is the attempt's error ("connect:
// connection refused"), which says why, not the deadline's. It still
// matches context.DeadlineExceeded.
type noConnection struct {
	dial, call error
}

func (e *noConnection) Error() string {
	return e.dial.Error() + " (no connection; the call gave up at its deadline)"
}

func (e *noConnection) Unwrap() []error { return []error{e.dial, e.call} }

// whyNoConnection is err, named by the last failed connection attempt
// when err is a deadline and no attempt has succeeded since one failed in
// the last few seconds.
func (s *Store) whyNoConnection(err error) error {
	if !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if f := s.dialErr.Load(); f != nil && time.Since(f.at) < 5*time.Second {
		return &noConnection{dial: f.err, call: err}
	}
	return err
}

func (d dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// countDials installs the dial counter on the client, and on every node of
// a Cluster.
func (s *Store) countDials() {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(dialCounter{s}) })
	case *redis.Client:
		c.AddHook(dialCounter{s})
	}
}

// sendState is what notSent compares against: whether the client has any
// connection, and how many it has made.
type sendState struct {
	conns bool
	dials uint64
}

func (s *Store) sendState() sendState {
	st := sendState{dials: s.dials.Load(), conns: true}
	switch c := s.client.(type) {
	case *redis.ClusterClient, *redis.Client:
		st.conns = c.(interface{ PoolStats() *redis.PoolStats }).PoolStats().TotalConns > 0
	}
	return st
}

// notSent marks err ErrNotSent when nothing can have been sent since
// before was read.
func (s *Store) notSent(before sendState, err error) error {
	if before.conns || s.dials.Load() != before.dials || s.sendState().conns {
		return err
	}
	return fmt.Errorf("%w: %w", claim.ErrNotSent, err)
}
