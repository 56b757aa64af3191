package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Waking waiters. A retry that waits for the first attempt's outcome
// (concurrent: wait) subscribes to its key's channel: every script that
// settles or frees a key (complete, release, settle orphan, forget)
// publishes on the channel named after the key, so a waiter learns of the
// outcome one message later instead of at its next poll. One subscription
// connection per process (per master on a Cluster, with sharded pub/sub,
// so a message never crosses the cluster bus) carries every waiter's
// channels; a channel is subscribed while at least one waiter watches it.
//
// A message can be lost (a reconnect, a failover, a slot moving): waiters
// keep a slow poll as the safety net. Every confirmation of a
// subscription, the first and those after a reconnect, wakes the channel's
// waiters too, so that they look at the key once the channel is live.

// keyWatch wakes a waiter when its key may have changed (claim.Watch).
type keyWatch struct {
	// c receives (at most one pending value) when the key may have been
	// settled or freed, and once when the subscription is live.
	c       chan struct{}
	channel string
	sub     *subscription
	w       *watcher
}

type watcher struct {
	client  redis.UniversalClient
	sharded bool // a Cluster: SSUBSCRIBE per master

	mu   sync.Mutex
	subs map[string]*subscription // by master address ("" when not sharded)
}

// subscription is one pub/sub connection and the waiters on its channels.
// SUBSCRIBE and UNSUBSCRIBE are written by its own goroutine, in the order
// the waiters asked for them (pending, under the watcher's lock), so that
// no waiter holds the lock across network I/O: with Redis unreachable, a
// write waits for a dial, and every waiter would queue behind it.
type subscription struct {
	ps       *redis.PubSub
	channels map[string]*channelState
	pending  []subscribeOp
	kick     chan struct{}
	closed   bool
}

type subscribeOp struct {
	channel   string
	subscribe bool // false: unsubscribe
}

type channelState struct {
	live    bool // its subscription was confirmed
	waiters map[*keyWatch]struct{}
}

func newWatcher(client redis.UniversalClient) *watcher {
	_, sharded := client.(*redis.ClusterClient)
	return &watcher{client: client, sharded: sharded, subs: map[string]*subscription{}}
}

// publishCommand is what the scripts publish with.
func (w *watcher) publishCommand() string {
	if w.sharded {
		return "spublish"
	}
	return "publish"
}

// Watch starts watching key; the caller must Stop it. When the key's
// channel is already live, C is ready at once, so the caller looks at the
// key without waiting for a message it may have missed.
func (s *Store) Watch(ctx context.Context, key string) claim.Watch {
	return s.watch.add(ctx, key)
}

func (w *watcher) add(ctx context.Context, channel string) *keyWatch {
	c := make(chan struct{}, 1)
	wt := &keyWatch{c: c, channel: channel, w: w}
	node := ""
	if w.sharded {
		if m, err := w.client.(*redis.ClusterClient).MasterForKey(ctx, channel); err == nil {
			node = m.Options().Addr
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	sub := w.subs[node]
	if sub == nil {
		sub = &subscription{channels: map[string]*channelState{}, kick: make(chan struct{}, 1)}
		// No I/O yet: the connection is made by the first SUBSCRIBE.
		if w.sharded {
			sub.ps = w.client.SSubscribe(context.Background())
		} else {
			sub.ps = w.client.Subscribe(context.Background())
		}
		w.subs[node] = sub
		go w.write(sub)
	}
	wt.sub = sub
	st := sub.channels[channel]
	if st == nil {
		st = &channelState{waiters: map[*keyWatch]struct{}{}}
		sub.channels[channel] = st
		sub.ask(subscribeOp{channel, true})
	}
	st.waiters[wt] = struct{}{}
	if st.live {
		wt.wake()
	}
	return wt
}

// C receives when the key may have changed.
func (wt *keyWatch) C() <-chan struct{} { return wt.c }

// Stop ends the watch; the channel is unsubscribed when nobody else
// watches it.
func (wt *keyWatch) Stop() {
	w := wt.w
	w.mu.Lock()
	defer w.mu.Unlock()
	// Nothing wakes wt once it is out of waiters (wakes run under w.mu);
	// one that came before, unread, goes with it: a stopped watch is not
	// woken.
	defer func() {
		select {
		case <-wt.c:
		default:
		}
	}()
	st := wt.sub.channels[wt.channel]
	if st == nil {
		return
	}
	delete(st.waiters, wt)
	if len(st.waiters) > 0 {
		return
	}
	delete(wt.sub.channels, wt.channel)
	wt.sub.ask(subscribeOp{wt.channel, false})
}

// ask queues op for the subscription's writer; the caller holds the
// watcher's lock.
func (sub *subscription) ask(op subscribeOp) {
	if sub.closed {
		return
	}
	sub.pending = append(sub.pending, op)
	select {
	case sub.kick <- struct{}{}:
	default:
	}
}

// write sends the subscription's pending SUBSCRIBEs and UNSUBSCRIBEs in
// order, until the watcher closes. It starts the receiving goroutine once
// the first SUBSCRIBE was sent: a receive that came first would connect
// with no channel named, which on a Cluster is any node, where an
// SSUBSCRIBE of another shard's channel is refused; after the first, the
// connection, and any reconnection, is made for the subscribed channels.
func (w *watcher) write(sub *subscription) {
	ctx := context.Background()
	receiving := false
	for range sub.kick {
		w.mu.Lock()
		ops := sub.pending
		sub.pending = nil
		w.mu.Unlock()
		for _, op := range ops {
			switch {
			case op.subscribe && w.sharded:
				_ = sub.ps.SSubscribe(ctx, op.channel)
			case op.subscribe:
				_ = sub.ps.Subscribe(ctx, op.channel)
			case w.sharded:
				_ = sub.ps.SUnsubscribe(ctx, op.channel)
			default:
				_ = sub.ps.Unsubscribe(ctx, op.channel)
			}
		}
		if !receiving {
			receiving = true
			go w.receive(sub)
		}
	}
}

func (wt *keyWatch) wake() {
	select {
	case wt.c <- struct{}{}:
	default:
	}
}

// receive wakes the waiters of every channel a message or a subscription
// confirmation names, until the subscription is closed.
func (w *watcher) receive(sub *subscription) {
	for m := range sub.ps.ChannelWithSubscriptions() {
		var channel string
		confirmed := false
		switch m := m.(type) {
		case *redis.Message:
			channel = m.Channel
		case *redis.Subscription:
			if m.Kind != "subscribe" && m.Kind != "ssubscribe" {
				continue
			}
			channel, confirmed = m.Channel, true
		default:
			continue
		}
		w.mu.Lock()
		if st := sub.channels[channel]; st != nil {
			st.live = st.live || confirmed
			for wt := range st.waiters {
				wt.wake()
			}
		}
		w.mu.Unlock()
	}
}

// close closes every subscription.
func (w *watcher) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for node, sub := range w.subs {
		sub.closed = true
		close(sub.kick)
		_ = sub.ps.Close()
		delete(w.subs, node)
	}
}
