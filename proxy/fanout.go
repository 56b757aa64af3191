package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Fanning a running stream out to its followers. Every append publishes
// on the key's channel, and every follower on this sidecar wakes with it;
// each reading the store on its own cost Redis one read per follower per
// append (180-211 commands per event with 64 followers). So the followers
// woken by one append share one read: the first to ask for the stream
// from an offset waits for the next flush tick (wake-ups coalesced, at
// most one read per tick and offset), reads once, and everyone who asked
// for the same offset meanwhile gets that read. Followers that kept up
// ask from the same offset, so a stream costs about one read per flush
// on this sidecar, however many follow it.

// fanoutTick is the flush interval reads are coalesced on.
const fanoutTick = 20 * time.Millisecond

// sharedReads are the store reads of running streams in progress on this
// sidecar, by key and offset.
type sharedReads struct {
	mu sync.Mutex
	// m guards nothing else; it is guarded by mu.
	m map[readAt]*sharedRead
}

// readAt is one stream's key and the offset read from.
type readAt struct {
	key  string
	from int
}

// sharedRead is one read, which every follower asking for the same key
// and offset before it ends shares.
type sharedRead struct {
	done chan struct{}
	part claim.StreamPart
	err  error
}

// read returns the part of key's stream from from on, reading it with do
// (on a context of its own: the follower that started the read may leave)
// unless a read of the same key and offset is already under way, which it
// then shares. It returns ctx's error if ctx ends first.
func (s *sharedReads) read(ctx context.Context, key string, from int, do func(context.Context) (claim.StreamPart, error)) (claim.StreamPart, error) {
	k := readAt{key, from}
	s.mu.Lock()
	if s.m == nil {
		s.m = map[readAt]*sharedRead{}
	}
	r, shared := s.m[k]
	if !shared {
		r = &sharedRead{done: make(chan struct{})}
		s.m[k] = r
	}
	s.mu.Unlock()
	if !shared {
		go s.lead(k, r, do)
	}
	select {
	case <-r.done:
		return r.part, r.err
	case <-ctx.Done():
		return claim.StreamPart{}, ctx.Err()
	}
}

// lead runs r, once the flush tick has come: the followers one append
// woke ask meanwhile, and share it.
func (s *sharedReads) lead(k readAt, r *sharedRead, do func(context.Context) (claim.StreamPart, error)) {
	now := time.Now()
	time.Sleep(now.Truncate(fanoutTick).Add(fanoutTick).Sub(now))
	ctx, cancel := settleCtx()
	r.part, r.err = do(ctx)
	cancel()
	s.mu.Lock()
	delete(s.m, k) // a later ask is a later append's: a new read
	s.mu.Unlock()
	close(r.done)
}
