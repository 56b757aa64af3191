package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Store calls: every store operation a request makes goes through storeOp
// (or detached), which times it (idemproxy_store_operation_seconds{op})
// and traces it (storeSpan); op is one of storeOps, whose error series
// exist from the start.

// storeOp runs store operation op (one of storeOps) with ctx, timed and
// traced as op: every store call of a request goes through it.
func (a *attempt) storeOp(ctx context.Context, op string, call func(context.Context) error) error {
	start := time.Now()
	err := call(ctx)
	a.observeStore(op, start, err)
	return err
}

// detached is storeOp on a context of its own: detached from the client,
// whose hanging up cannot unsend a write, and bounded (settleCtx).
func (a *attempt) detached(op string, call func(context.Context) error) error {
	ctx, cancel := settleCtx()
	defer cancel()
	return a.storeOp(ctx, op, call)
}

// observeStore times store operation op, which started at start, and
// traces it.
func (a *attempt) observeStore(op string, start time.Time, err error) {
	a.p.metrics.storeTime(op).Observe(time.Since(start).Seconds())
	if a.seen != nil {
		a.seen.storeSpan(op, start, err)
	}
}

// retried is detached store operation op, run again while the store is
// unavailable (claim.ErrUnavailable: each such failure is counted in
// idemproxy_store_errors_total{op}), at most once per storeRetryWaits,
// after its wait: the writes after the upstream answered, whose failure
// is the dual-write window. Any other error (the lease lost, a record
// unreadable, a stream out of step) is returned at once: retrying cannot
// help.
func (a *attempt) retried(op string, call func(context.Context) error) error {
	return a.retriedOn(settleCtx, op, call)
}

// retriedOn is retried with each try on a context from newCtx.
func (a *attempt) retriedOn(newCtx func() (context.Context, context.CancelFunc), op string, call func(context.Context) error) error {
	var err error
	for _, wait := range storeRetryWaits {
		time.Sleep(wait)
		ctx, cancel := newCtx()
		err = a.storeOp(ctx, op, call)
		cancel()
		if err == nil || !errors.Is(err, claim.ErrUnavailable) {
			return err
		}
		a.p.storeError(op)
	}
	return err
}

// Store-write retry after the upstream answered: the dual-write window.
// The client is answered either way; these bound how long it waits.
var storeRetryWaits = []time.Duration{0, 25 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// settleTimeout bounds each settle operation (complete, release, keep).
const settleTimeout = 2 * time.Second

// settleCtx is detached from the client and bounded.
func settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), settleTimeout)
}
