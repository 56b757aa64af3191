package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Renew extends the owner's lease, for rec's token and tail: ErrLeaseLost
// when the key is gone or another owner's, nil when already completed.
func (s *Store) Renew(ctx context.Context, key string, rec *claim.Record, lease time.Duration) error {
	var n int
	if err := s.do(ctx, "renew", "idem_renew", key, false, []any{key, rec.Token[:], (lease + rec.Tail).Milliseconds()}, &n); err != nil {
		return err
	}
	if n == 1 || n == -2 {
		return nil
	}
	return fmt.Errorf("renew: %w", claim.ErrLeaseLost)
}

// Complete replaces the owner's in-progress record with rec, kept for
// retention; ErrLeaseLost, writing nothing, when another owner holds the
// key.
func (s *Store) Complete(ctx context.Context, key string, rec *claim.Record, retention time.Duration) (claim.Completion, error) {
	var n int
	if err := s.do(ctx, "complete", "idem_complete", key, true, []any{key, rec.Token[:], s.codec.Encode(key, rec), retention.Milliseconds()}, &n); err != nil {
		return 0, err
	}
	switch n {
	case 1, 3:
		return claim.Stored, nil
	case 2:
		return claim.StoredAfterLapse, nil
	}
	return 0, fmt.Errorf("complete: %w", claim.ErrLeaseLost)
}

// SettleOrphan replaces orphan's claim, its lease over, with rec, fenced
// on its token and on its expiry being the one read (a renewal moves it).
func (s *Store) SettleOrphan(ctx context.Context, key string, orphan, rec *claim.Record, retention time.Duration) error {
	var n int
	args := []any{key, orphan.Token[:], s.codec.Encode(key, rec), retention.Milliseconds(), orphan.Tail.Milliseconds(), expiryMS(orphan), claim.ExpiryJitter.Milliseconds()}
	if err := s.do(ctx, "settle orphan", "idem_orphan", key, true, args, &n); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("settle orphan: %w", claim.ErrLeaseLost)
	}
	return nil
}

// Release deletes the owner's claim while it is in progress.
func (s *Store) Release(ctx context.Context, key string, token claim.Token) error {
	var n int
	if err := s.do(ctx, "release", "idem_release", key, true, []any{key, token[:]}, &n); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("release: %w", claim.ErrLeaseLost)
	}
	return nil
}

// ReleaseUnconfirmed deletes token's claim if it is there; found says it
// was.
func (s *Store) ReleaseUnconfirmed(ctx context.Context, key string, token claim.Token) (bool, error) {
	var n int
	if err := s.do(ctx, "release", "idem_release", key, true, []any{key, token[:]}, &n); err != nil {
		return false, err
	}
	return n == 1, nil
}

// ReleaseUnforwarded deletes a claim its owner never forwarded, fenced on
// its token, state and status slot.
func (s *Store) ReleaseUnforwarded(ctx context.Context, key string, ghost *claim.Record) error {
	var n int
	if err := s.do(ctx, "release", "idem_release_unforwarded", key, true, []any{key, ghost.Token[:], slot(ghost)}, &n); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("release unforwarded: %w", claim.ErrLeaseLost)
	}
	return nil
}

// TakeOver replaces old, a record whose outcome is unknown, with rec, the
// caller's claim; it returns since, on the database's clock
// (claim.Recovery).
func (s *Store) TakeOver(ctx context.Context, key string, old, rec *claim.Record, lease time.Duration, since time.Time) (time.Time, error) {
	var sinceMS int64
	if !since.IsZero() {
		sinceMS = since.UnixMilli()
	}
	var res int
	var got, nowMS *int64
	args := []any{key, old.Token[:], s.codec.Encode(key, rec), (lease + rec.Tail).Milliseconds(), old.Tail.Milliseconds(), sinceMS, expiryMS(old), claim.ExpiryJitter.Milliseconds()}
	if err := s.do(ctx, "take over", "idem_take_over", key, false, args, &res, &got, &nowMS); err != nil {
		return time.Time{}, err
	}
	if res != 1 || got == nil {
		return time.Time{}, fmt.Errorf("take over: %w", claim.ErrLeaseLost)
	}
	return time.UnixMilli(*got), nil
}

// FreeAbsent frees a key taken over after an absent answer, once the
// first attempt is old enough on the database's clock and that clock and
// this one agree (claim.Recovery).
func (s *Store) FreeAbsent(ctx context.Context, key string, token claim.Token, since time.Time, after time.Duration) error {
	var res int
	var n *int64
	args := []any{key, token[:], since.UnixMilli(), after.Milliseconds(), s.clocks.Now().UnixMilli(), claim.MaxClockOffset.Milliseconds()}
	if err := s.do(ctx, "free absent", "idem_free_absent", key, true, args, &res, &n); err != nil {
		return err
	}
	switch {
	case res == -4 && n != nil:
		return &claim.TooEarlyError{Left: time.Duration(*n) * time.Millisecond}
	case res == -6 && n != nil:
		return &claim.TooEarlyError{Left: time.Second, Skew: time.Duration(*n) * time.Millisecond}
	case res != 1:
		return fmt.Errorf("free absent: %w", claim.ErrLeaseLost)
	}
	return nil
}
