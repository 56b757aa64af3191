package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// held is a batcher with every in-flight slot taken, so that operations
// queue until release sends one: then everything queued goes out behind it
// in one pipeline.
type held struct {
	b     *batcher
	sizes chan int
}

func hold(t *testing.T, client redis.UniversalClient) *held {
	h := &held{sizes: make(chan int, 100)}
	h.b = newBatcher(client, func(n int) { h.sizes <- n })
	for range maxInFlight {
		h.b.queue.Admit(nil) // a batch out that never comes back
	}
	return h
}

// queue starts op in a goroutine and waits until it is queued.
func (h *held) queue(t *testing.T, ctx context.Context, cmds ...redis.Cmder) chan error {
	t.Helper()
	_, n := h.b.queue.Counts()
	done := make(chan error, 1)
	go func() { done <- h.b.do(ctx, 10, cmds...) }()
	poll.Until(t, "the operation is queued", func() bool {
		_, q := h.b.queue.Counts()
		return q == n+1
	})
	return done
}

// release sends cmds as one held batch that comes back: what was queued
// follows it, and then that slot is free.
func (h *held) release(ctx context.Context, cmds ...redis.Cmder) error {
	h.b.run([]*pending{{ctx: ctx, cmds: cmds}})
	return nil
}

// TestBatchKeepsEachOperationsResult: queued operations go out as one
// pipeline; a failing command fails only its own operation; a queued
// operation whose context ends returns at once and is never sent.
func TestBatchKeepsEachOperationsResult(t *testing.T) {
	t.Parallel() // on servers of its own
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client()
	if err := c.Set(ctx, "text", "not a number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	h := hold(t, c)

	var cmds []*redis.IntCmd
	var dones []chan error
	for i := range 5 {
		cmd := redis.NewIntCmd(ctx, "incrby", fmt.Sprintf("n%d", i), i+1)
		cmds = append(cmds, cmd)
		dones = append(dones, h.queue(t, ctx, cmd))
	}
	bad := redis.NewIntCmd(ctx, "incr", "text")
	badDone := h.queue(t, ctx, bad)
	cancelled, cancel := context.WithCancel(ctx)
	never := redis.NewStatusCmd(cancelled, "set", "never", "sent")
	neverDone := h.queue(t, cancelled, never)
	cancel()
	if err := <-neverDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled operation returned %v, want context.Canceled", err)
	}

	first := redis.NewStatusCmd(ctx, "ping")
	if err := h.release(ctx, first); err != nil || first.Err() != nil {
		t.Fatalf("first operation: %v, %v", err, first.Err())
	}
	for i, done := range dones {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n, err := cmds[i].Result(); err != nil || n != int64(i+1) {
			t.Errorf("operation %d got %d, %v; want its own result %d", i, n, err, i+1)
		}
	}
	if err := <-badDone; err != nil {
		t.Fatal(err)
	}
	if bad.Err() == nil {
		t.Error("INCR of a string succeeded")
	}
	if n := c.Exists(ctx, "never").Val(); n != 0 {
		t.Error("an operation cancelled while queued was sent")
	}
	if got := []int{<-h.sizes, <-h.sizes}; got[0] != 1 || got[1] != 6 {
		t.Errorf("batch sizes = %v, want [1 6]: the lone operation, then the six queued together", got)
	}
	// A batch's callers have their results a moment before its runner
	// gives its slot back: wait for the bookkeeping, not a fixed time.
	settled := h.b.queue.Counts
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if n, q := settled(); n == maxInFlight-1 && q == 0 {
			return
		}
	}
	n, q := settled()
	t.Errorf("after the batches: %d in flight, %d queued; want %d and 0", n, q, maxInFlight-1)
}

// TestBatchDeadlineIsPerOperation: an operation whose deadline passes while
// its batch is out returns at once with its own error; the batch runs on
// and the other operations in it succeed.
func TestBatchDeadlineIsPerOperation(t *testing.T) {
	t.Parallel() // on servers of its own
	ctx := context.Background()
	c, err := NewClient(ClientOptions{Addrs: []string{redistest.Start(t).Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := hold(t, c)
	other := redis.NewIntCmd(ctx, "incr", "other")
	otherDone := h.queue(t, ctx, other)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	slowDone := h.queue(t, short, redis.NewCmd(short, "blpop", "empty-list", "0.3"))
	start := time.Now()
	go func() { _ = h.release(ctx, redis.NewStatusCmd(ctx, "ping")) }()
	if err := <-slowDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("operation past its deadline returned %v", err)
	}
	if waited := time.Since(start); waited > 250*time.Millisecond {
		t.Logf("the expired operation returned after %s (a loaded machine)", waited)
	}
	if err := <-otherDone; err != nil || other.Err() != nil || other.Val() != 1 {
		t.Fatalf("the other operation in the batch: %v, %v, %d", err, other.Err(), other.Val())
	}
}

// TestBatchOnADeadConnection: when Redis goes away under a batch, every
// operation in it gets an error of its own, the batcher gives its slots
// back, and operations succeed again once Redis is back.
func TestBatchOnADeadConnection(t *testing.T) {
	t.Parallel() // on servers of its own
	ctx := context.Background()
	srv := redistest.Start(t)
	c, err := NewClient(ClientOptions{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := hold(t, c)
	var cmds []*redis.IntCmd
	var dones []chan error
	for i := range 4 {
		cmd := redis.NewIntCmd(ctx, "incr", fmt.Sprintf("d%d", i))
		cmds = append(cmds, cmd)
		dones = append(dones, h.queue(t, ctx, cmd))
	}
	srv.Stop()
	_ = h.release(ctx, redis.NewStatusCmd(ctx, "ping"))
	for i, done := range dones {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if cmds[i].Err() == nil {
			t.Errorf("operation %d succeeded against a stopped Redis", i)
		}
	}
	srv.Restart()
	s := &Store{client: c, codec: claim.NewCodec("dead:"), prefix: "dead:", batch: h.b, clocks: claim.NewClocks(nil, nil)}
	poll.Until(t, "Redis answers again", func() bool { return s.Ping(ctx) == nil })
	var wg sync.WaitGroup
	var failed atomic.Int32
	for g := range 16 {
		wg.Go(func() {
			rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
			rec.Token[0] = byte(g)
			if res, err := s.Claim(ctx, s.Codec().Key("p", "r", fmt.Sprint(g)), rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d claims failed after Redis came back", failed.Load())
	}
}

// TestBatchAcrossClusterSlots: one pipeline of operations on keys in every
// slot of a 3-master Cluster; go-redis sends each to its node, and each
// operation gets its own result.
func TestBatchAcrossClusterSlots(t *testing.T) {
	t.Parallel() // on servers of its own
	ctx := context.Background()
	cluster := redistest.StartCluster(t, 3, 0)
	c, err := NewClient(ClientOptions{Addrs: cluster.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := hold(t, c)
	nodes := map[string]bool{}
	var cmds []*redis.Cmd
	var dones []chan error
	for i := range 30 {
		key := fmt.Sprintf("slot-%d", i)
		node, err := c.(*redis.ClusterClient).MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr] = true
		cmd := redis.NewCmd(ctx, "set", key, key, "px", time.Minute.Milliseconds(), "nx", "get")
		cmds = append(cmds, cmd)
		dones = append(dones, h.queue(t, ctx, cmd))
	}
	if len(nodes) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(nodes))
	}
	if err := h.release(ctx, redis.NewStatusCmd(ctx, "ping")); err != nil {
		t.Fatal(err)
	}
	for i, done := range dones {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := cmds[i].Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("claim of slot-%d: %v, want set (nil reply)", i, err)
		}
		if v := c.Get(ctx, fmt.Sprintf("slot-%d", i)).Val(); v != fmt.Sprintf("slot-%d", i) {
			t.Errorf("slot-%d holds %q", i, v)
		}
	}
	if got := []int{<-h.sizes, <-h.sizes}; got[1] != 30 {
		t.Errorf("batch sizes = %v, want the 30 queued operations in one batch", got)
	}
}
