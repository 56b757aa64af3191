package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy/claim"
)

// Group commit. Each operation on a key is one call of a schema function,
// and alone it is a transaction of its own: its own round trip, its own
// commit and its own WAL flush, however many arrive together. The batcher
// sends an operation at once while fewer than maxInFlight batches are out
// (a lone request pays no hand-off and no timer) and queues it otherwise;
// when a batch comes back, everything queued meanwhile goes out together,
// bounded by maxBatchOps and maxBatchBytes, as one pipeline: every call,
// in key order, then one Sync, so that they commit together in one
// implicit transaction (one commit, one flush), then the wake-ups of the
// keys that asked for one, after a Sync of their own (notify.go: the
// writes never wait on them).
//
// Each operation keeps its own answer. The batch commits whole or not at
// all: when the server refuses any statement of it (a deadlock with
// another sidecar's batch, a function's error) or its commit, nothing of
// it was written, and every operation runs again alone, so that one
// operation's failure is only its own. When the connection breaks before
// the commit's answer, whether it committed is unknown, as for an
// operation alone: every operation gets that error (ambiguous, unless
// nothing was sent). Calls within a batch take their rows' locks in key
// order, as every batch does, so that two batches never wait on each
// other in a circle over records. A claim with a quota is counted after
// the batch's commit, in a transaction of its own that takes the
// counters sorted and commits without waiting for the WAL's flush
// (idem_count, countQuotas), batched or alone: no claim's transaction
// holds a counter, so batches of one principal do not queue on its row
// one commit at a time, and none waits on another in a circle (issue 78:
// counted inside each claim, with quota.new_keys and two principals,
// batches deadlocked, stalled for deadlock_timeout and answered 503).
const (
	maxInFlight   = 2
	maxBatchOps   = 128
	maxBatchBytes = 1 << 20
)

// op is one operation: a call of one of the schema's functions on key,
// its one row scanned into dst, and when wake, key's waiters woken after
// it commits.
type op struct {
	ctx  context.Context
	name string // the operation, for errors ("claim", "complete")
	fn   string // the function, by its name in schema.sql
	args []any
	dst  []any
	key  string
	wake bool
	size int
	// quota, when set, is the claim's count against its quota, made
	// after its transaction commits (countQuotas); epoch, when set,
	// receives the store's epoch as the same transaction read it.
	quota *quotaCall
	epoch *epochRead
	// err is the operation's result; done is signalled when a batch
	// sent it (nil: its caller runs the batch itself).
	err  error
	done chan struct{}
}

// batcher groups a store's operations (above).
type batcher struct {
	s     *Store
	queue claim.Queue[*op]

	// onBatch, when set, is told the size of every batch sent.
	onBatch func(ops int)
}

// do runs o, in a batch when others wait, and returns its error; when
// o's context ends while o waits, it returns at once (ErrNotSent when o
// was not sent yet; a SendingError when its batch is out).
func (b *batcher) do(o *op) error {
	if err := o.ctx.Err(); err != nil {
		return notSentErr(o, err)
	}
	o.done = make(chan struct{}, 1)
	if b.queue.Admit(o) {
		o.done = nil // run signals no one: this caller waits for it to return
		b.run([]*op{o})
		return o.err
	}
	select {
	case <-o.done:
		return o.err
	case <-o.ctx.Done():
		if b.queue.Withdraw(o) {
			return notSentErr(o, o.ctx.Err())
		}
		// Sent: it may commit. The batch signals o.done when it is over.
		return &claim.SendingError{Err: o.ctx.Err(), Done: o.done}
	}
}

// notSentErr is o's error when it ended unsent: nothing written.
func notSentErr(o *op, err error) error {
	return fmt.Errorf("%w: %w", claim.ErrNotSent, claim.Unavailable(o.name, err))
}

// run sends batch and signals its callers; a batch queued meanwhile goes
// out from a new goroutine, so that this caller returns at once.
func (b *batcher) run(batch []*op) {
	b.send(batch)
	for _, o := range batch {
		if o.done != nil {
			o.done <- struct{}{}
		}
	}
	if next := b.queue.Next(); next != nil {
		go b.run(next)
	}
}

// newBatcher is s's batcher, at most inFlight batches out; onBatch may
// be nil.
func newBatcher(s *Store, inFlight int, onBatch func(ops int)) *batcher {
	b := &batcher{s: s, onBatch: onBatch}
	b.queue = claim.Queue[*op]{Max: inFlight, MaxOps: maxBatchOps, MaxBytes: maxBatchBytes, Size: func(o *op) int { return o.size }}
	return b
}

// send runs batch: one operation alone, several in one transaction, each
// again alone when the server refused that transaction.
func (b *batcher) send(batch []*op) {
	if b.onBatch != nil {
		b.onBatch(len(batch))
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	if len(batch) == 1 {
		batch[0].err = b.s.alone(ctx, batch[0])
		return
	}
	slices.SortStableFunc(batch, func(x, y *op) int { return strings.Compare(x.key, y.key) })
	err := b.s.together(ctx, batch)
	var refused *pgconn.PgError
	switch {
	case errors.As(err, &refused):
		b.s.unnamedAfter(err)
		var wg sync.WaitGroup
		for _, o := range batch {
			wg.Go(func() { o.err = b.s.alone(ctx, o) })
		}
		wg.Wait()
	case err != nil:
		for _, o := range batch {
			if o.err == nil {
				o.err = b.s.unavailable(o.name, err)
			}
		}
	}
}

// batchContext is a batch's context: no caller's cancellation, and the
// latest of their deadlines, or none when one of them has none.
func batchContext(batch []*op) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, o := range batch {
		d, ok := o.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// alone runs o by itself: its call and, when o wakes, the wake-up, in one
// round trip (rowNotify), or the call alone (row); a claim under a quota
// is counted after it in the same round trip, and one that reads the
// epoch reads it in its transaction (together).
func (s *Store) alone(ctx context.Context, o *op) error {
	if o.quota != nil || o.epoch != nil {
		err := s.refusedAgain(func() error { return s.together(ctx, []*op{o}) })
		if err != nil && o.err == nil {
			o.err = s.unavailable(o.name, err)
		}
		return o.err
	}
	if o.wake {
		return s.rowNotify(ctx, o.name, o.fn, o.key, o.args, o.dst...)
	}
	return s.row(ctx, o.name, o.fn, o.args, o.dst...)
}

// together sends batch in one pipeline: every call, one Sync (one
// transaction, one commit), then the wake-ups and their Sync. It sets
// each operation's own error where only that operation failed (its
// arguments or its answer could not be read); it returns a *PgError when
// the server refused the transaction (nothing of it committed), and any
// other error when the batch failed as a whole.
func (s *Store) together(ctx context.Context, batch []*op) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release() // a connection left busy or broken is destroyed by the pool
	pc, m := c.Conn().PgConn(), c.Conn().TypeMap()
	pl, err := s.plan(ctx, c.Conn(), batch)
	if err != nil {
		return err
	}
	p := pc.StartPipeline(ctx)
	pl.send(p)
	if len(pl.wakes) > 0 {
		if err := s.sendWakes(p, m, pl.wake, pl.wakes); err != nil {
			p.Close()
			return err
		}
	}
	if err := p.Flush(); err != nil {
		p.Close()
		return err
	}
	if err := readAll(p, m, pl, batch); err != nil {
		p.Close()
		return err
	}
	var countErr, wakeErr error
	if pl.count != nil {
		countErr = readCount(p, m, pl)
	}
	if len(pl.wakes) > 0 {
		wakeErr = s.readWakes(p)
	}
	p.Close() // every answer that decides anything is read
	if countErr != nil {
		s.countAgain(ctx, c.Conn(), pl, countErr)
	}
	if wakeErr != nil && !(s.unnamedAfter(wakeErr) && s.wakeAgain(ctx, c.Conn(), pl.wakes)) {
		s.notifyFailures.Add(1)
	}
	return nil
}

// readCount reads the count's answer (idem_count) and its Sync.
func readCount(p *pgconn.Pipeline, m *pgtype.Map, pl *batchPlan) error {
	var refused []string
	var retryMS []int64
	err := readRow(p, m, fields([]any{&refused, &retryMS}))
	if _, syncErr := p.GetResults(); err == nil {
		err = syncErr
	}
	if err == nil {
		noteRefused(pl.counted, refused, retryMS)
	}
	return err
}

// countAgain counts pl's claims once more, alone, after their count
// failed where their claims had committed: a pooler sent the count's
// named statement to a server without it (unnamedAfter). When the count
// fails otherwise, or again, the counted claims fail as when their
// commit's answer is lost: nothing is forwarded, and their records lapse
// with their leases.
func (s *Store) countAgain(ctx context.Context, c *pgx.Conn, pl *batchPlan, err error) {
	if s.unnamedAfter(err) {
		var sd *pgconn.StatementDescription
		if sd, err = s.statement(ctx, c, pl.count.sql); err == nil {
			var refused []string
			var retryMS []int64
			rr := execute(ctx, c.PgConn(), pl.count.sql, sd, pl.count.params)
			if err = scanRow(rr, c.TypeMap(), fields([]any{&refused, &retryMS})); err == nil {
				noteRefused(pl.counted, refused, retryMS)
				return
			}
		}
	}
	for _, o := range pl.counted {
		if o.err == nil {
			o.err = claim.Unavailable(o.name, err)
		}
	}
}

// batchPlan is a batch's statements as together sends them: every call
// and the epoch's read when its claims ask for it, then one Sync; the
// quota count when they have quotas, and its Sync; and the keys to wake
// after both, with the wake-up's statement.
type batchPlan struct {
	sent    []encoded
	count   *encoded
	counted []*op
	epoch   *encoded
	wakes   []string
	wake    *pgconn.StatementDescription
}

// plan encodes batch's statements on c (their descriptions prepared or
// cached before the pipeline starts).
func (s *Store) plan(ctx context.Context, c *pgx.Conn, batch []*op) (*batchPlan, error) {
	var pl batchPlan
	var err error
	if pl.sent, err = s.encodeAll(ctx, c, batch); err != nil {
		return nil, err
	}
	for _, e := range pl.sent {
		if e.o.wake {
			pl.wakes = append(pl.wakes, e.o.key)
		}
	}
	if len(pl.wakes) > 0 {
		if pl.wake, err = s.statement(ctx, c, s.wakeSQL); err != nil {
			return nil, err
		}
	}
	if pl.count, pl.counted, err = s.countQuotas(ctx, c, pl.sent); err != nil {
		return nil, err
	}
	if pl.epoch, err = s.readEpochWith(ctx, c, batch); err != nil {
		return nil, err
	}
	return &pl, nil
}

// send queues the plan's transactions on p: the calls, the epoch's read
// and their Sync, then the count and its own (idem_count: a count that
// follows a failed transaction counts nothing).
func (pl *batchPlan) send(p *pgconn.Pipeline) {
	for _, e := range pl.sent {
		send(p, e.sql, e.sd, e.params)
	}
	if pl.epoch != nil {
		send(p, pl.epoch.sql, pl.epoch.sd, pl.epoch.params)
	}
	p.SendPipelineSync()
	if pl.count != nil {
		send(p, pl.count.sql, pl.count.sd, pl.count.params)
		p.SendPipelineSync()
	}
}

// quotaCall is a claim's count against its quota (idem_count): the
// counter's key, the claim's token, the quota; refused is set when the
// count refused the claim, to what is left of the quota's window.
type quotaCall struct {
	key             string
	token           []byte
	limit, windowMS int64
	refused         *time.Duration
}

// countQuotas is the statement that counts the claims of sent that have
// a quota (idem_count), in their counters' key order, after their
// transaction (nil when none has one), and those claims in that order.
func (s *Store) countQuotas(ctx context.Context, c *pgx.Conn, sent []encoded) (*encoded, []*op, error) {
	var counted []*op
	for _, e := range sent {
		if e.o.quota != nil {
			counted = append(counted, e.o)
		}
	}
	if counted == nil {
		return nil, nil, nil
	}
	slices.SortStableFunc(counted, func(x, y *op) int { return strings.Compare(x.quota.key, y.quota.key) })
	keys, toks, qkeys := make([]string, len(counted)), make([][]byte, len(counted)), make([]string, len(counted))
	limits, windows := make([]int64, len(counted)), make([]int64, len(counted))
	for i, o := range counted {
		keys[i], toks[i], qkeys[i] = o.key, o.quota.token, o.quota.key
		limits[i], windows[i] = o.quota.limit, o.quota.windowMS
	}
	sql := s.call("idem_count", 5)
	sd, params, err := s.bind(ctx, c, sql, []any{keys, toks, qkeys, limits, windows})
	if err != nil {
		return nil, nil, err
	}
	return &encoded{sql: sql, sd: sd, params: params}, counted, nil
}

// readEpochWith is the read of the store's epoch marker that the claims
// of batch asking for it (op.epoch) share, in their transaction; nil when
// none asks.
func (s *Store) readEpochWith(ctx context.Context, c *pgx.Conn, batch []*op) (*encoded, error) {
	if !slices.ContainsFunc(batch, func(o *op) bool { return o.epoch != nil }) {
		return nil, nil
	}
	sql := "SELECT (SELECT m.value FROM " + s.schema + ".markers m WHERE m.name = $1)," +
		" (EXTRACT(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::bigint," +
		" (SELECT pg_catalog.convert_from(r.value, 'UTF8') FROM " + s.schema + ".records r WHERE r.key = $2)"
	sd, params, err := s.bind(ctx, c, sql, []any{s.codec.Prefix() + "epoch", s.codec.Prefix() + "epoch:server"})
	if err != nil {
		return nil, err
	}
	return &encoded{sql: sql, sd: sd, params: params}, nil
}

// readEpoch reads the epoch's read into the ops of batch that asked.
func readEpoch(p *pgconn.Pipeline, m *pgtype.Map, batch []*op) error {
	var v, wm *string
	var started int64
	if err := readRow(p, m, []any{&v, &started, &wm}); err != nil {
		return err
	}
	for _, o := range batch {
		if o.epoch != nil {
			o.epoch.started, o.epoch.watermark = started, watermarkOf(wm)
			if v != nil {
				o.epoch.marker = *v
			}
		}
	}
	return nil
}

// noteRefused reads idem_count's answer into counted: each claim it
// refused gets what is left of its quota's window.
func noteRefused(counted []*op, refused []string, retryMS []int64) {
	for i, key := range refused {
		for _, o := range counted {
			if o.key == key && o.quota.refused == nil && i < len(retryMS) {
				left := time.Duration(retryMS[i]) * time.Millisecond
				o.quota.refused = &left
				break
			}
		}
	}
}

// encoded is an operation of a batch with its arguments in the wire
// format of its statement.
type encoded struct {
	o      *op
	sql    string
	sd     *pgconn.StatementDescription
	params [][]byte
}

// encodeAll encodes every operation's arguments for pc; one whose
// arguments cannot be encoded fails alone, unsent.
func (s *Store) encodeAll(ctx context.Context, c *pgx.Conn, batch []*op) ([]encoded, error) {
	m := c.TypeMap()
	sent := make([]encoded, 0, len(batch))
	for _, o := range batch {
		sql := s.call(o.fn, len(o.args))
		sd, err := s.statement(ctx, c, sql)
		if err != nil {
			return nil, err
		}
		params, err := encodeArgs(m, sd, o.args)
		if err != nil {
			o.err = fmt.Errorf("%s: %w: %w", o.name, claim.ErrNotSent, err)
			continue
		}
		sent = append(sent, encoded{o: o, sql: sql, sd: sd, params: params})
	}
	return sent, nil
}

// readAll reads every call's row and the commit's answer. A row that
// cannot be scanned is its operation's error alone (the transaction goes
// on); a server's error means the transaction rolled back, and the
// answers read before it stand for nothing (Close reads past the rest).
func readAll(p *pgconn.Pipeline, m *pgtype.Map, pl *batchPlan, batch []*op) error {
	for _, e := range pl.sent {
		err := readRow(p, m, fields(e.o.dst))
		var scan *scanError
		switch {
		case errors.As(err, &scan):
			e.o.err = claim.Unavailable(e.o.name, err)
		case err != nil:
			return err
		}
	}
	if pl.epoch != nil {
		if err := readEpoch(p, m, batch); err != nil {
			return err
		}
	}
	res, err := p.GetResults()
	if err != nil {
		return err
	}
	if _, ok := res.(*pgconn.PipelineSync); !ok {
		return fmt.Errorf("pipeline: unexpected result %T where the commit was", res)
	}
	return nil
}

// readWakes reads the wake-ups' answer and their Sync.
func (s *Store) readWakes(p *pgconn.Pipeline) error {
	err := readRow(p, nil, nil)
	if _, syncErr := p.GetResults(); err == nil {
		err = syncErr
	}
	return err
}
