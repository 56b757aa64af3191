package claim

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SetAt is when the claim's SET ran on Redis' clock, as its own round
// trip read it; zero when the caller did not claim the key, or Redis'
// clock was not read.
func (r Result) SetAt() time.Time {
	if !r.Claimed {
		return time.Time{}
	}
	return r.redisNow
}

// ReadAt is Redis' clock as the claim's round trip read it, claimed or
// not; zero when not read.
func (r Result) ReadAt() time.Time { return r.redisNow }

// expiryJitter is how far two readings of one unchanged key's expiry
// (the store's clock plus the key's TTL, read in one script) may differ:
// milliseconds on Redis, up to the embedded store's clock tick. A renewal
// moves the expiry by at least a third of the shortest lease (333 ms).
const expiryJitter = 100 * time.Millisecond

// SameExpiry reports whether a and b, two readings of a key's expiry on
// the store's clock (Record.Expires), are the same expiry: no renewal
// came between them.
func SameExpiry(a, b time.Time) bool {
	d := a.Sub(b)
	return -expiryJitter <= d && d <= expiryJitter
}

// expiryArg is a record's Expires as a script argument: Unix ms, 0 when
// not read (the script then does not fence on it).
func expiryArg(r *Record) int64 {
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
func (s *Store) TakeOver(ctx context.Context, key string, old, rec *Record, lease time.Duration, since time.Time) (time.Time, error) {
	value := s.encode(key, rec)
	var sinceMS int64
	if !since.IsZero() {
		sinceMS = since.UnixMilli()
	}
	run, wait := s.evalWrite(ctx, takeOverScript, key, len(value), old.Token[:], value, (lease + rec.Tail).Milliseconds(), old.Tail.Milliseconds(), sinceMS, expiryArg(old), expiryJitter.Milliseconds())
	v, err := run.Int64Slice()
	if err != nil {
		return time.Time{}, s.unavailable("take over", err)
	}
	if len(v) == 0 || v[0] != 1 {
		return time.Time{}, fmt.Errorf("take over: %w", ErrLeaseLost)
	}
	if len(v) != 3 {
		return time.Time{}, fmt.Errorf("take over: unexpected reply %v: %w", v, ErrUnavailable)
	}
	s.checkWait("claim", wait)
	return time.UnixMilli(v[1]), nil
}

// ErrTooEarly is FreeAbsent's answer while the first attempt is younger
// than the age an absent answer needs; TooEarlyError says how much
// younger.
var ErrTooEarly = errors.New("claim: too early to believe the first attempt absent")

// TooEarlyError is ErrTooEarly with the time still to wait.
type TooEarlyError struct {
	Left time.Duration
	// Skew, when not zero, is how far the store's clock was ahead of the
	// caller's (behind, negative): more than the rules allow, so the age
	// could not be told at all.
	Skew time.Duration
}

func (e *TooEarlyError) Error() string {
	if e.Skew != 0 {
		return fmt.Sprintf("%v (the store's clock and this one differ by %s)", ErrTooEarly, e.Skew)
	}
	return fmt.Sprintf("%v (%s to go)", ErrTooEarly, e.Left)
}

func (e *TooEarlyError) Unwrap() error { return ErrTooEarly }

// FreeAbsent deletes the caller's claim (token) once after has passed
// since since, both on Redis' clock, read in the same script: the
// upstream said it never acted on the key, and no first attempt can still
// be running. The script also compares Redis' clock with this process'
// and refuses when they differ by more than maxClockOffset: a step of
// either clock alone never frees a key. A *TooEarlyError when it is too
// early or the clocks disagree (the claim is left as it is); ErrLeaseLost
// when the claim is no longer the caller's.
func (s *Store) FreeAbsent(ctx context.Context, key string, token Token, since time.Time, after time.Duration) error {
	v, err := s.eval(ctx, freeAbsentScript, key, 0, token[:], since.UnixMilli(), after.Milliseconds(), s.watch.publishCommand(),
		s.now().UnixMilli(), maxClockOffset.Milliseconds()).Int64Slice()
	switch {
	case err != nil:
		return s.unavailable("free absent", err)
	case len(v) == 2 && v[0] == -4:
		return &TooEarlyError{Left: time.Duration(v[1]) * time.Millisecond}
	case len(v) == 2 && v[0] == -6:
		return &TooEarlyError{Left: time.Second, Skew: time.Duration(v[1]) * time.Millisecond}
	case len(v) == 0 || v[0] != 1:
		return fmt.Errorf("free absent: %w", ErrLeaseLost)
	}
	return nil
}
