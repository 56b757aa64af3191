package pgstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/jackc/pgx/v5/pgconn"
)

// Claim takes key for rec's owner with a lease, or returns the record that
// already holds it, in one round trip (idem_claim), which also reads the
// key's lease and the database's clock; with a quota the count rides in
// the same function, and a claim beyond it is undone there. Whether the
// claim may be forwarded is decided from that round trip
// (claim.Clocks.Confirm).
func (s *Store) Claim(ctx context.Context, key string, rec *claim.Record, lease time.Duration, q claim.Quota) (claim.Result, error) {
	sent := s.clocks.Begin(rec, lease)
	if s.full.Load() {
		return s.claimWhenFull(ctx, key, rec)
	}
	res, err := s.claim(ctx, key, rec, lease, q)
	if err != nil && notSent(err) {
		err = fmt.Errorf("%w: %w", claim.ErrNotSent, err)
	}
	if err != nil || !res.Claimed {
		return res, err
	}
	return s.clocks.Confirmed(ctx, rec, res, sent, func(ctx context.Context) error { return s.Renew(ctx, key, rec, lease) })
}

// notSent reports whether err provably left nothing at the server, so
// the claim wrote nothing and needs no cleanup (claim.ErrNotSent): no
// connection could be made (the statement needs one), or pgconn says the
// failure came before anything was sent. A failure on a connection the
// statement had may have been written, and is not.
func notSent(err error) bool {
	var connect *pgconn.ConnectError
	return errors.As(err, &connect) || pgconn.SafeToRetry(err) || refusedWhole(err)
}

// refusedWhole reports whether the server refused err's statement as a
// whole, so that it wrote nothing and the connection is of no more use:
// the server is read-only (SQLSTATE 25006: a demoted primary, a standby
// the pool reached after a failover) or shutting down (57P01).
func refusedWhole(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "25006" || pe.Code == "57P01")
}

// PlantUnconfirmed writes rec's claim as one whose reply never reached its
// owner leaves it (marked, never confirmed, never renewed). For tests.
func (s *Store) PlantUnconfirmed(ctx context.Context, key string, rec *claim.Record, lease time.Duration) error {
	rec.Mark, rec.Lease = claim.MarkClaimed, lease
	res, err := s.claim(ctx, key, rec, lease, claim.Quota{})
	if err == nil && !res.Claimed {
		err = fmt.Errorf("plant: the key is taken: %w", claim.ErrLeaseLost)
	}
	return err
}

// replayFirst is the claim's statement around call, the call of
// idem_claim: a settled record (a replay, the claim's commonest answer)
// is read by the statement itself, and the function is called only when
// there is none. The function's own first step is the same read, with the
// same answer (kind 2, the record, the database's clock), but a call of a
// plpgsql function costs the server about as much as the read itself:
// measured with pgbench -M prepared -c 8 on PostgreSQL 15, 25-27 µs of
// the server's CPU per replay against 31-36 µs through the function. A
// new key pays one more index probe that finds nothing.
//
// The test of the state byte is a one-byte substring, as the partial
// index's, so that a large TOASTed record is not decompressed whole to
// read it.
func (s *Store) replayFirst(call string) string {
	return "SELECT CASE WHEN r.value IS NULL THEN " + strings.TrimPrefix(call, "SELECT ") +
		" ELSE ROW(2, r.value, NULL::bigint, n.now_ms, NULL::int) END" +
		" FROM (SELECT pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint AS now_ms) n" +
		" LEFT JOIN " + s.schema + ".records r ON r.key = $1 AND r.expires_ms > n.now_ms" +
		" AND pg_catalog.substring(r.value, " + settledTest
}

// settledTest is the rest of replayFirst's test of the state byte: its
// position from the codec's declaration (claim.Fields), a completed
// record's state.
var settledTest = claim.SQLLayout("{{rec.state.at}}, {{rec.state.len}}) = '\\x02'::bytea")

// claimCall is one claim's arguments and answer in one allocation: they
// go to the batch that sends the call, so that the argument list and
// each destination on its own would be an allocation of its own.
type claimCall struct {
	kind   int
	cur    []byte
	pttl   *int64
	nowMS  int64
	length *int

	args [7]any
	dst  [5]any
}

// claim is the claim's round trip.
func (s *Store) claim(ctx context.Context, key string, rec *claim.Record, lease time.Duration, q claim.Quota) (claim.Result, error) {
	// The claim is counted against its quota after every record its
	// transaction takes (idem_count): idem_claim gets no quota.
	var qc *quotaCall
	if q.Limit > 0 {
		qc = &quotaCall{key: q.Key, token: rec.Token[:], limit: q.Limit, windowMS: q.Window.Milliseconds()}
	}
	limit := s.codec.StreamReadLimit()
	c := &claimCall{args: [7]any{key, s.codec.Encode(key, rec), (lease + rec.Tail).Milliseconds(), limit, nil, int64(0), int64(0)}}
	c.dst = [5]any{&c.kind, &c.cur, &c.pttl, &c.nowMS, &c.length}
	o := &op{ctx: ctx, name: "claim", fn: "idem_claim", key: key, quota: qc, args: c.args[:], dst: c.dst[:]}
	if rec.ReadEpoch {
		// A claim that says when its request was first sent learns of a
		// lost epoch in its own round trip: the marker, read in its
		// transaction, against the one last looked at (EpochStart).
		o.epoch = &epochRead{expect: s.knownWatermark()}
	}
	if err := s.doWith(ctx, o); err != nil {
		return claim.Result{}, err
	}
	if o.epoch != nil {
		s.noteEpochRead(*o.epoch)
	}
	if qc != nil && qc.refused != nil {
		return claim.Result{}, &claim.QuotaError{RetryAfter: max(*qc.refused, time.Millisecond)}
	}
	kind, cur, pttl, nowMS, length := c.kind, c.cur, c.pttl, c.nowMS, c.length
	now := time.UnixMilli(nowMS)
	left := time.Duration(0)
	if pttl != nil {
		left = time.Duration(*pttl) * time.Millisecond
	}
	switch kind {
	case 1:
		return claim.Result{Claimed: true, PTTL: left, ServerNow: now}, nil
	case 2:
		return s.codec.Existing(key, rec, cur, 0, time.Time{})
	case 3:
		return s.codec.Existing(key, rec, cur, left, now)
	case 4:
		return claim.Result{}, &claim.QuotaError{RetryAfter: max(left, time.Millisecond)}
	case 0:
		n := 0
		if length != nil {
			n = *length
		}
		return claim.Result{}, fmt.Errorf("claim: a streamed record of %d bytes, over the %d read back: %w", n, limit, &claim.RecordError{Reason: claim.ReasonTooLarge})
	}
	return claim.Result{}, fmt.Errorf("claim: unexpected kind %d: %w", kind, claim.ErrUnavailable)
}

// claimWhenFull answers a claim while the store is full: a key that holds
// a record is answered from it; a free key is ErrFull.
func (s *Store) claimWhenFull(ctx context.Context, key string, rec *claim.Record) (claim.Result, error) {
	cur, pttl, now, err := s.read(ctx, key)
	if err != nil {
		return claim.Result{}, err
	}
	if cur == nil {
		return claim.Result{}, claim.ErrFull
	}
	return s.codec.Existing(key, rec, cur, pttl, now)
}

// read is key's value (nil: none), what is left of its lease, and the
// database's clock.
func (s *Store) read(ctx context.Context, key string) ([]byte, time.Duration, time.Time, error) {
	var cur []byte
	var pttl, nowMS int64
	if err := s.pool.QueryRow(ctx, s.readQuery, key).Scan(&cur, &pttl, &nowMS); err != nil {
		return nil, 0, time.Time{}, claim.Unavailable("get", err)
	}
	if pttl < 0 {
		return nil, 0, time.Time{}, nil
	}
	return cur, time.Duration(pttl) * time.Millisecond, time.UnixMilli(nowMS), nil
}

// Get returns the record under key, or nil when there is none, and for an
// in-progress record what is left of its lease (see Result.TTL); an
// in-progress record carries its expiry on the database's clock
// (Record.Expires), read in the same round trip.
func (s *Store) Get(ctx context.Context, key string) (*claim.Record, time.Duration, error) {
	cur, pttl, now, err := s.read(ctx, key)
	if err != nil || cur == nil {
		return nil, 0, err
	}
	rec, err := s.codec.Open(key, cur)
	if err != nil {
		return nil, 0, err
	}
	if rec.State == claim.InProgress {
		rec.Expires, rec.ReadAt = now.Add(pttl), now
		return rec, claim.LeaseLeft(rec, pttl), nil
	}
	return rec, pttl, nil
}

// slot is a claim's status slot, as stored.
func slot(rec *claim.Record) []byte {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], rec.MarkSlot())
	return b[:]
}

// expiryMS is a record's Expires as a fence: Unix ms, 0 when not read.
func expiryMS(r *claim.Record) int64 {
	if r.Expires.IsZero() {
		return 0
	}
	return r.Expires.UnixMilli()
}
