package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Group commit. Every store operation is a short list of commands on one
// key. Sent one by one, each pays its own write and read syscalls, its own
// pool checkout and its own turn of Redis' event loop; under load dozens
// wait at any moment. The batcher sends an operation at once when fewer
// than maxInFlight batches are out (so a lone request pays no hand-off and
// no timer), and queues it otherwise; when a batch comes back, everything
// queued meanwhile goes out together as the next pipeline, bounded by
// maxBatchOps and maxBatchBytes. On a Cluster, go-redis splits a pipeline
// by node and follows MOVED and ASK per command.
//
// Each operation keeps its own result, error and deadline: the pipeline
// runs under a context of its own that carries the latest deadline in the
// batch, and a caller whose context ends returns at once (leaving the
// queue if it had not been sent), so one operation's timeout or cancelled
// client never fails another's. Every operation is safe to resend
// (package doc), so go-redis' retry of a whole pipeline after a broken
// connection is safe too.
const (
	maxInFlight   = 4
	maxBatchOps   = 128
	maxBatchBytes = 1 << 20
)

type batcher struct {
	client redis.UniversalClient

	mu       sync.Mutex
	queue    []*pending
	inFlight int

	// onBatch, when set, is told the size of every batch sent (tests,
	// metrics).
	onBatch func(ops int)
}

// pending is one operation: its commands go out together, in order, in one
// batch.
type pending struct {
	ctx  context.Context
	cmds []redis.Cmder
	size int
	done chan struct{}
}

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// do sends cmds as one operation and returns when their results are in
// them, or with ctx's error when ctx ends first; then the caller must not
// read cmds, which a batch may still be filling. size is about how many
// bytes the commands carry.
func (b *batcher) do(ctx context.Context, size int, cmds ...redis.Cmder) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.inFlight < maxInFlight {
		b.inFlight++
		b.mu.Unlock()
		p := &pending{ctx: ctx, cmds: cmds}
		b.run([]*pending{p})
		return nil
	}
	p := pendingPool.Get().(*pending)
	p.ctx, p.cmds, p.size = ctx, cmds, size
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case <-p.done:
		p.ctx, p.cmds = nil, nil
		pendingPool.Put(p)
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, p); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			p.ctx, p.cmds = nil, nil
			pendingPool.Put(p)
			return ctx.Err()
		}
		b.mu.Unlock()
		// Already sent: the batch will signal p.done when go-redis is done
		// with it, resends included; p is not reused, so that signal
		// reaches only whoever waits on the error's channel.
		return &claim.SendingError{Err: ctx.Err(), Done: p.done}
	}
}

// run sends batch and signals its callers; a batch queued meanwhile goes
// out from a new goroutine, so that this caller returns at once.
func (b *batcher) run(batch []*pending) {
	b.send(batch)
	for _, p := range batch {
		if p.done != nil { // nil: the caller of do, waiting for run to return
			p.done <- struct{}{}
		}
	}
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	next := b.takeLocked()
	b.mu.Unlock()
	go b.run(next)
}

// takeLocked takes the next batch off the queue, bounded in operations and
// bytes (one operation larger than the bound goes alone).
func (b *batcher) takeLocked() []*pending {
	n, size := 0, 0
	for n < len(b.queue) && n < maxBatchOps && (n == 0 || size+b.queue[n].size <= maxBatchBytes) {
		size += b.queue[n].size
		n++
	}
	batch := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	return batch
}

// send runs every command of batch in one pipeline (or one command alone).
func (b *batcher) send(batch []*pending) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	if b.onBatch != nil {
		b.onBatch(len(batch))
	}
	if len(batch) == 1 && len(batch[0].cmds) == 1 {
		_ = b.client.Process(ctx, batch[0].cmds[0])
		return
	}
	pipe := b.client.Pipeline()
	for _, p := range batch {
		_ = pipe.BatchProcess(ctx, p.cmds...)
	}
	_, _ = pipe.Exec(ctx)
}

// batchContext is a context for a batch: no caller's cancellation, and the
// latest of their deadlines, or none when one of them has none (the
// client's read and write timeouts still bound every socket operation).
// It carries the deadline without a timer (deadlineOnly): go-redis sets
// its socket deadlines from it (ContextTimeoutEnabled), so a batch past
// it fails on its next socket operation, and a wait for a pooled
// connection is bounded by the pool's timeout. A timer and its context
// per operation were two allocations and a timer on every claim.
func batchContext(batch []*pending) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range batch {
		d, ok := p.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return deadlineOnly{context.Background(), latest}, func() {}
}

// deadlineOnly is a context that is never cancelled and has a deadline:
// Err stays nil past it (the socket deadlines end the commands).
type deadlineOnly struct {
	context.Context
	deadline time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.deadline, true }
