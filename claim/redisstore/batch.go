package redisstore

import (
	"context"
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
	queue  claim.Queue[*pending]

	// onBatch, when set, is told the size of every batch sent (tests,
	// metrics).
	onBatch func(ops int)
}

// newBatcher is client's batcher; onBatch may be nil.
func newBatcher(client redis.UniversalClient, onBatch func(ops int)) *batcher {
	b := &batcher{client: client, onBatch: onBatch}
	b.queue = claim.Queue[*pending]{Max: maxInFlight, MaxOps: maxBatchOps, MaxBytes: maxBatchBytes, Size: func(p *pending) int { return p.size }}
	return b
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
	p := pendingPool.Get().(*pending)
	p.ctx, p.cmds, p.size = ctx, cmds, size
	if b.queue.Admit(p) {
		done := p.done
		p.done = nil // run signals no one: this caller waits for it to return
		b.run([]*pending{p})
		p.ctx, p.cmds, p.done = nil, nil, done
		pendingPool.Put(p)
		return nil
	}
	select {
	case <-p.done:
		p.ctx, p.cmds = nil, nil
		pendingPool.Put(p)
		return nil
	case <-ctx.Done():
		if b.queue.Withdraw(p) {
			p.ctx, p.cmds = nil, nil
			pendingPool.Put(p)
			return ctx.Err()
		}
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
	if next := b.queue.Next(); next != nil {
		go b.run(next)
	}
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
