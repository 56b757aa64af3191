package redisstore

import (
	"context"
	"fmt"
	"net"

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

// dialCounter counts successful dials: a go-redis hook.
type dialCounter struct{ s *Store }

func (d dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			d.s.dials.Add(1)
		}
		return c, err
	}
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
