package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Wake-ups never decide a write. A NOTIFY inside the writing function's
// transaction would make its COMMIT depend on the cluster's notification
// queue, which any session of any database fills (a listener idle in a
// transaction, or on purpose): a full queue fails the COMMIT, and the
// write with it. So no function of the schema notifies; an operation that
// settles, frees or appends to a key runs its function and then
// pg_notify as two statements of one pipeline with a Sync between them:
// the write commits alone, in its own implicit transaction, and the
// wake-up rides the same round trip, best effort. A notify that fails is
// counted (NotifyFailures) and changes nothing else: waiters keep their
// poll.
//
// And a key nobody waits for costs no NOTIFY. A waiter registers (a row
// of the waiters table, by Watch: one per key and sidecar, shared by its
// waiters of the key) before it first reads its key, and the
// wake-up statement, which runs after the write committed, notifies only
// the keys with a waiter registered: either the registration committed
// before that statement read the table, and the waiter is woken; or the
// write committed before the registration, and the waiter's first read
// sees it. A NOTIFY costs the server a write to the cluster's queue and a
// signal to every listening session, and the listening sidecar its read:
// measured, about a quarter of a first attempt's cost on the server,
// paid for every completion while nobody waited (docs/benchmarks.md).

// notifySQL is the listener's probe: channel idemproxy, $1 the payload.
const notifySQL = "SELECT pg_catalog.pg_notify('idemproxy', $1)"

// wakeSQL is the wake-up statement of the store whose wake-up function
// (idem_wake) is fn: a NOTIFY for every key of $1 with a waiter
// registered. A function, not a query, so that the server plans the
// lookup once per connection, not once per batch.
func wakeSQL(fn string) string { return "SELECT " + fn + "($1)" }

// sendWakes queues the wake-up statement for keys, and its Sync, on p.
// sd is the wake-up statement's description on p's connection.
func (s *Store) sendWakes(p *pgconn.Pipeline, m *pgtype.Map, sd *pgconn.StatementDescription, keys []string) error {
	k, err := m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, keys, nil)
	if err != nil {
		return err
	}
	send(p, s.wakeSQL, sd, [][]byte{k})
	p.SendPipelineSync()
	return nil
}

// rowNotify runs one of the schema's functions with args, as row does,
// scanning its one row into dst, and then wakes key's waiters (above).
func (s *Store) rowNotify(ctx context.Context, op, fn, key string, args []any, dst ...any) error {
	err := s.refusedAgain(func() error {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release() // a connection left busy or broken is destroyed by the pool
		return s.pipeline(ctx, c, s.call(fn, len(args)), args, key, dst)
	})
	if err != nil {
		return s.unavailable(op, err)
	}
	return nil
}

// pipeline sends the statement and the wake-up in one round trip, each
// followed by its Sync, and reads both answers.
func (s *Store) pipeline(ctx context.Context, c *pgxpool.Conn, sql string, args []any, key string, dst []any) error {
	sd, params, err := s.bind(ctx, c.Conn(), sql, args)
	if err != nil {
		return err
	}
	m := c.Conn().TypeMap()
	wake, err := s.statement(ctx, c.Conn(), s.wakeSQL)
	if err != nil {
		return err
	}
	p := c.Conn().PgConn().StartPipeline(ctx)
	send(p, sql, sd, params)
	p.SendPipelineSync()
	if err := s.sendWakes(p, m, wake, []string{key}); err != nil {
		p.Close()
		return err
	}
	if err := p.Flush(); err != nil {
		p.Close()
		return err
	}
	writeErr := readRow(p, m, fields(dst))
	if _, err := p.GetResults(); err != nil && writeErr == nil { // the write's Sync
		writeErr = err
	}
	notifyErr := readRow(p, m, nil)
	if _, err := p.GetResults(); err != nil && notifyErr == nil { // the wake-up's Sync
		notifyErr = err
	}
	closeErr := p.Close()
	if writeErr == nil && closeErr != nil && notifyErr == nil {
		// The write's answer was read whole before this: it stands.
		notifyErr = closeErr
	}
	if notifyErr != nil && !(s.unnamedAfter(notifyErr) && s.wakeAgain(ctx, c.Conn(), []string{key})) {
		s.notifyFailures.Add(1)
	}
	return writeErr
}

// wakeAgain sends the wake-up of keys once more, on its own, after the
// server refused it as a named statement that a pooler routed elsewhere
// (unnamedAfter; the store sends unnamed from then on). The wake-up runs
// after its writes' Sync, where a transaction pooler may hand the
// session another server connection: the writes committed, and their
// waiters must still hear of them. It reports whether it went out.
func (s *Store) wakeAgain(ctx context.Context, c *pgx.Conn, keys []string) bool {
	sd, err := s.statement(ctx, c, s.wakeSQL)
	if err != nil {
		return false
	}
	k, err := c.TypeMap().Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, keys, nil)
	if err != nil {
		return false
	}
	_, err = execute(ctx, c.PgConn(), s.wakeSQL, sd, [][]byte{k}).Close()
	return err == nil
}

// readRow reads the next result of p: one row, scanned into dst (nothing
// when dst is nil).
func readRow(p *pgconn.Pipeline, m *pgtype.Map, dst []any) error {
	res, err := p.GetResults()
	if err != nil {
		return err
	}
	rr, ok := res.(*pgconn.ResultReader)
	if !ok {
		return fmt.Errorf("pipeline: unexpected result %T", res)
	}
	return scanRow(rr, m, dst)
}

// scanRow reads rr whole: one row, scanned into dst (nothing when dst is
// nil).
func scanRow(rr *pgconn.ResultReader, m *pgtype.Map, dst []any) error {
	rows := 0
	var scanErr error
	for rr.NextRow() {
		rows++
		if dst == nil || scanErr != nil {
			continue
		}
		fds, vals := rr.FieldDescriptions(), rr.Values()
		if len(vals) != len(dst) {
			scanErr = fmt.Errorf("answer: %d columns, %d destinations", len(vals), len(dst))
			continue
		}
		for i := range vals {
			if err := m.Scan(fds[i].DataTypeOID, fds[i].Format, vals[i], dst[i]); err != nil {
				scanErr = fmt.Errorf("scan column %d: %w", i+1, err)
				break
			}
		}
	}
	if _, err := rr.Close(); err != nil {
		return err
	}
	if scanErr != nil {
		return &scanError{scanErr}
	}
	if dst != nil && rows != 1 {
		return &scanError{errors.New("answer: no row")}
	}
	return nil
}

// encodeArgs is args in the wire format of sd's parameters, every one
// of them appended to one buffer, as pgx encodes its own (a buffer per
// argument was most of a call's allocations). A NULL is a nil parameter;
// an empty value is not. A parameter keeps its bytes when the buffer
// grows past it: the old array stays behind it, unchanged.
func encodeArgs(m *pgtype.Map, sd *pgconn.StatementDescription, args []any) ([][]byte, error) {
	params := make([][]byte, len(args))
	buf := make([]byte, 0, 256) // never nil: an empty value is not NULL
	for i, a := range args {
		start := len(buf)
		out, err := m.Encode(sd.ParamOIDs[i], pgtype.BinaryFormatCode, a, buf)
		if err != nil {
			return nil, fmt.Errorf("encode argument %d: %w", i+1, err)
		}
		if out == nil {
			continue // NULL
		}
		buf = out
		params[i] = buf[start:len(buf):len(buf)]
	}
	return params, nil
}

// scanError is an answer the server gave that could not be read: the
// statement ran.
type scanError struct{ err error }

func (e *scanError) Error() string { return e.err.Error() }
func (e *scanError) Unwrap() error { return e.err }

// NotifyFailures is how many wake-ups could not be sent since the store
// opened (the write before each stood): a full notification queue, or a
// connection lost after the write's answer.
func (s *Store) NotifyFailures() int64 { return s.notifyFailures.Load() }
