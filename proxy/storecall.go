package proxy

import (
	"context"
	"time"
)

// Store calls: every store operation a request makes goes through storeOp
// (or detached), which times it (idemproxy_store_operation_seconds{op})
// and traces it (storeSpan); op is one of storeOps, whose error series
// exist from the start.

// storeOps are the store operations, the values of the op label. A new
// operation is one line here; the store names its span (claim.Span).
var storeOps = []string{
	"claim", "get", "renew", "complete", "release", "epoch", "take_over",
	"free_absent", "stream_start", "stream_append", "stream_end", "stream_read",
}

// storeOp runs store operation op (one of storeOps) with ctx, timed and
// traced as op: every store call of a request goes through it.
func (x *exchange) storeOp(ctx context.Context, op string, call func(context.Context) error) error {
	start := time.Now()
	err := call(ctx)
	x.observeStore(op, start, err)
	return err
}

// detached is storeOp on a context of its own: detached from the client,
// whose hanging up cannot unsend a write, and bounded (settleCtx).
func (x *exchange) detached(op string, call func(context.Context) error) error {
	ctx, cancel := settleCtx()
	defer cancel()
	return x.storeOp(ctx, op, call)
}

// observeStore times store operation op, which started at start, and
// traces it.
func (x *exchange) observeStore(op string, start time.Time, err error) {
	x.h.metrics.storeSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	x.storeSpan(op, start, err)
}
