package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// expiryArg is a record's Expires as a script argument: Unix ms, 0 when
// not read (the script then does not fence on it).
func expiryArg(r *claim.Record) int64 {
	if r.Expires.IsZero() {
		return 0
	}
	return r.Expires.UnixMilli()
}

// TakeOver replaces old, a record whose outcome is unknown (an orphaned
// claim, or a completed record), with rec, the caller's in-progress claim
// of lease (plus rec.Tail), so that only the caller asks the upstream what
// happened. since is the completed record's first attempt on Redis' clock
// (zero: unknown). It returns, on Redis' clock, the time from which an
// absent answer is judged (FreeAbsent): never earlier than the first
// attempt's last sign of life. ErrLeaseLost: the key changed, the
// orphan's owner renewed (its key's expiry is no longer old.Expires, when
// that was read), or old is a streamed record, which is never taken
// over.
func (s *Store) TakeOver(ctx context.Context, key string, old, rec *claim.Record, lease time.Duration, since time.Time) (time.Time, error) {
	value := s.codec.Encode(key, rec)
	var sinceMS int64
	if !since.IsZero() {
		sinceMS = since.UnixMilli()
	}
	run, wait := s.evalWrite(ctx, takeOverScript, key, len(value), old.Token[:], value, (lease + rec.Tail).Milliseconds(), old.Tail.Milliseconds(), sinceMS, expiryArg(old), claim.ExpiryJitter.Milliseconds())
	v, err := run.Int64Slice()
	if err != nil {
		return time.Time{}, s.unavailable("take over", err)
	}
	if len(v) == 0 || v[0] != 1 {
		return time.Time{}, fmt.Errorf("take over: %w", claim.ErrLeaseLost)
	}
	if len(v) != 3 {
		return time.Time{}, fmt.Errorf("take over: unexpected reply %v: %w", v, claim.ErrUnavailable)
	}
	s.checkWait("claim", wait)
	return time.UnixMilli(v[1]), nil
}

// FreeAbsent deletes the caller's claim (token) once after has passed
// since since, both on Redis' clock, read in the same script: the
// upstream said it never acted on the key, and no first attempt can still
// be running. The script also compares Redis' clock with this process'
// and refuses when they differ by more than MaxClockOffset: a step of
// either clock alone never frees a key. A *TooEarlyError when it is too
// early or the clocks disagree (the claim is left as it is); ErrLeaseLost
// when the claim is no longer the caller's.
func (s *Store) FreeAbsent(ctx context.Context, key string, token claim.Token, since time.Time, after time.Duration) error {
	v, err := s.eval(ctx, freeAbsentScript, key, 0, token[:], since.UnixMilli(), after.Milliseconds(), s.watch.publishCommand(),
		s.clocks.Now().UnixMilli(), claim.MaxClockOffset.Milliseconds()).Int64Slice()
	switch {
	case err != nil:
		return s.unavailable("free absent", err)
	case len(v) == 2 && v[0] == -4:
		return &claim.TooEarlyError{Left: time.Duration(v[1]) * time.Millisecond}
	case len(v) == 2 && v[0] == -6:
		return &claim.TooEarlyError{Left: time.Second, Skew: time.Duration(v[1]) * time.Millisecond}
	case len(v) == 0 || v[0] != 1:
		return fmt.Errorf("free absent: %w", claim.ErrLeaseLost)
	}
	return nil
}
