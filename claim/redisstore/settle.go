package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Renew extends the owner's lease, for rec's token and tail. It returns
// ErrLeaseLost when the key is gone or owned by someone else, and nil when
// the record was already completed by this owner (a renewal racing the
// completion).
func (s *Store) Renew(ctx context.Context, key string, rec *claim.Record, lease time.Duration) error {
	n, err := s.eval(ctx, renewScript, key, 0, rec.Token[:], (lease + rec.Tail).Milliseconds()).Int64()
	if err != nil {
		return s.unavailable("renew", err)
	}
	switch n {
	case 1, -2:
		return nil
	default:
		return fmt.Errorf("renew: %w", claim.ErrLeaseLost)
	}
}

// Complete replaces the owner's in-progress record with rec (Completed),
// kept for retention. It returns ErrLeaseLost, writing nothing, when
// another owner holds the key.
func (s *Store) Complete(ctx context.Context, key string, rec *claim.Record, retention time.Duration) (claim.Completion, error) {
	var buf *[]byte
	var value []byte
	if !s.codec.Sealed() {
		buf = valuePool.Get().(*[]byte)
		value = s.codec.AppendEncoded(*buf, key, rec)
	} else {
		value = s.codec.Encode(key, rec)
	}
	args := []any{rec.Token[:], value, retention.Milliseconds(), s.watch.publishCommand()}
	run, wait := s.evalWrite(ctx, completeScript, key, len(value), args...)
	n, err := run.Int64()
	if err == nil {
		s.checkWait("complete", wait)
	}
	if buf != nil && err == nil && cap(value) <= maxPooledValue {
		// Redis has the value (an error may mean a command still in
		// flight, which must keep its buffer).
		*buf = value[:0]
		valuePool.Put(buf)
	}
	if err != nil {
		return 0, s.unavailable("complete", err)
	}
	switch n {
	case 1, 3:
		return claim.Stored, nil
	case 2:
		return claim.StoredAfterLapse, nil
	default:
		return 0, fmt.Errorf("complete: %w", claim.ErrLeaseLost)
	}
}

// SettleOrphan replaces the orphaned in-progress record of orphan's owner
// (see Record.Orphaned) with rec, a Completed record of the caller's own,
// kept for retention. The check is atomic with the write: it returns
// ErrLeaseLost, writing nothing, when the key changed since it was read
// (gone, completed, claimed by another) or the owner renewed its lease
// after all (its key's expiry is no longer orphan.Expires, when that was
// read); the caller then claims again.
func (s *Store) SettleOrphan(ctx context.Context, key string, orphan *claim.Record, rec *claim.Record, retention time.Duration) error {
	value := s.codec.Encode(key, rec)
	args := []any{orphan.Token[:], value, retention.Milliseconds(), orphan.Tail.Milliseconds(), s.watch.publishCommand(), expiryArg(orphan), claim.ExpiryJitter.Milliseconds()}
	run, wait := s.evalWrite(ctx, orphanScript, key, len(value), args...)
	n, err := run.Int64()
	if err == nil && n == 1 {
		s.checkWait("complete", wait)
	}
	if err != nil {
		return s.unavailable("settle orphan", err)
	}
	if n != 1 {
		return fmt.Errorf("settle orphan: %w", claim.ErrLeaseLost)
	}
	return nil
}

// Release deletes the owner's in-progress record so a retry can claim the
// key. A key that is already gone is not an error; one owned by someone
// else, or already completed, is ErrLeaseLost and is left alone.
func (s *Store) Release(ctx context.Context, key string, token claim.Token) error {
	n, err := s.eval(ctx, releaseScript, key, 0, token[:], s.watch.publishCommand()).Int64()
	if err != nil {
		return s.unavailable("release", err)
	}
	if n < 0 {
		return fmt.Errorf("release: %w", claim.ErrLeaseLost)
	}
	return nil
}

// ReleaseUnconfirmed deletes the in-progress record of token under key,
// for a claim whose reply never came (its SET may have run, or may run
// yet). found reports whether it was there and is gone now; false with a
// nil error when the key holds nothing of ours.
//
// It is sent at once on a connection of its own, never queued behind the
// pipeline's batches: those may be waiting on the very replies that came
// late, and every moment it waits is one in which a retry elsewhere may
// find the claim's lease over and settle it as outcome-unknown.
func (s *Store) ReleaseUnconfirmed(ctx context.Context, key string, token claim.Token) (found bool, err error) {
	n, err := releaseScript.Run(ctx, s.client, []string{key}, token[:], s.watch.publishCommand()).Int64()
	if err != nil {
		return false, s.unavailable("release", err)
	}
	return n == 1, nil
}

// ReleaseUnforwarded deletes ghost, an in-progress record found with
// Result.Unforwarded: a claim its owner never forwarded. It is fenced on
// ghost's token and status slot, so a claim that changed since (renewed,
// settled, replaced) is left alone and ErrLeaseLost returned.
func (s *Store) ReleaseUnforwarded(ctx context.Context, key string, ghost *claim.Record) error {
	var slot [2]byte
	binary.BigEndian.PutUint16(slot[:], ghost.MarkSlot())
	n, err := s.eval(ctx, releaseUnforwardedScript, key, 0, ghost.Token[:], slot[:], s.watch.publishCommand()).Int64()
	if err != nil {
		return s.unavailable("release", err)
	}
	if n < 0 {
		return fmt.Errorf("release unforwarded: %w", claim.ErrLeaseLost)
	}
	return nil
}

// Forget deletes the record under key, only while it is in state: an
// operator releases a stuck claim (InProgress) or forgets a stored answer
// (Completed), never the other by mistake. A key that is gone is not an
// error; one in another state is ErrStateChanged.
func (s *Store) Forget(ctx context.Context, key string, state claim.State) error {
	n, err := s.eval(ctx, forgetScript, key, 0, int(state), s.watch.publishCommand()).Int64()
	if err != nil {
		return s.unavailable("forget", err)
	}
	if n < 0 {
		return fmt.Errorf("forget: %w", claim.ErrStateChanged)
	}
	return nil
}

// valuePool holds the buffers completed records are encoded into: they
// hold the whole answer, and live only until Redis has them.
var valuePool = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledValue bounds the buffers kept: a rare large answer is not held
// for the next.
const maxPooledValue = 64 << 10
