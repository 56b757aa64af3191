package proxy

import (
	"context"
	"time"
)

// Store calls: every store operation a request makes goes through storeOp
// (or detached), which times it (idemproxy_store_operation_seconds{op})
// and traces it (storeSpan); op is one of storeOps, whose error series
// exist from the start.

// storeOps are the store operations, the values of the op label, each with
// the Redis command it sends, which names its span (the database semantic
// conventions): a read is GET, the claim and every fenced write a Lua
// script. A new operation is one line here.
var storeOps = []struct{ op, command string }{
	{"claim", "EVALSHA"},
	{"get", "GET"},
	{"renew", "EVALSHA"},
	{"complete", "EVALSHA"},
	{"release", "EVALSHA"},
	{"epoch", "EVALSHA"},
	{"take_over", "EVALSHA"},
	{"free_absent", "EVALSHA"},
	{"stream_start", "EVALSHA"},
	{"stream_append", "EVALSHA"},
	{"stream_end", "EVALSHA"},
	{"stream_read", "EVALSHA"},
}

// storeCommand is the Redis command store operation op sends.
func storeCommand(op string) string {
	for _, s := range storeOps {
		if s.op == op {
			return s.command
		}
	}
	return "EVALSHA"
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
