package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// StreamStart replaces the owner's in-progress claim (rec's token) with
// the head of a streamed answer (rec: State Streamed, Status, Header),
// kept for retention from now; the owner's lease, lease from now, is
// what readers take for it being alive. It returns the value's length,
// where the first chunk goes. ErrLeaseLost: the claim is not rec's.
func (s *Store) StreamStart(ctx context.Context, key string, rec *claim.Record, retention, lease time.Duration) (int, error) {
	value := s.codec.StreamHead(key, rec)
	run, wait := s.evalWrite(ctx, streamStartScript, key, len(value), rec.Token[:], value, retention.Milliseconds(), lease.Milliseconds(), s.watch.publishCommand())
	n, err := run.Int64()
	if err != nil {
		return 0, s.unavailable("stream start", err)
	}
	if n < 1 {
		return 0, fmt.Errorf("stream start: %w", claim.ErrLeaseLost)
	}
	s.checkWait("complete", wait)
	return len(value), nil
}

// StreamAppend appends data to token's running stream, whose stored value
// must be at bytes long, and renews its owner's lease (an empty data is a
// renewal alone). It returns the new length. ErrLeaseLost: not token's;
// ErrStreamOver: ended, or the lease ran out first; *StreamLengthError:
// the stored value is of another length (nothing appended).
func (s *Store) StreamAppend(ctx context.Context, key string, token claim.Token, at int, data []byte, lease time.Duration) (int, error) {
	data = s.codec.Chunk(key, token, at, data)
	run, wait := s.evalWrite(ctx, streamAppendScript, key, len(data), token[:], at, data, lease.Milliseconds(), s.watch.publishCommand())
	v, err := run.Int64()
	if err != nil {
		return 0, s.unavailable("stream append", err)
	}
	switch {
	case v > 0:
		s.checkWait("complete", wait)
		return int(v), nil
	case v <= -appendOther && int(-appendOther-v) == at+len(data) && len(data) > 0:
		// Resent after its reply was lost: the first send landed (only
		// the token's owner appends, one append at a time).
		return at + len(data), nil
	case v <= -appendOther:
		return 0, &claim.StreamLengthError{Len: int(-appendOther - v)}
	case v == -2 || v == -3:
		return 0, fmt.Errorf("stream append: %w", claim.ErrStreamOver)
	}
	return 0, fmt.Errorf("stream append: %w", claim.ErrLeaseLost)
}

// StreamFinish records how token's running stream ended. StreamEnded is
// fenced on the stored length being at (every chunk the client got is
// there); the abnormal ends take any length (at < 0).
func (s *Store) StreamFinish(ctx context.Context, key string, token claim.Token, end claim.StreamEnd, at int) error {
	last := s.codec.EndFrame(key, token, end, at) // a sealed stream's end frame
	run, wait := s.evalWrite(ctx, streamEndScript, key, len(last), token[:], int(end), at, s.watch.publishCommand(), last)
	v, err := run.Int64Slice()
	if err != nil {
		return s.unavailable("stream end", err)
	}
	switch {
	case len(v) >= 1 && v[0] == 1:
		s.checkWait("complete", wait)
		return nil
	case len(v) == 2 && v[0] == -5:
		return &claim.StreamLengthError{Len: int(v[1])}
	case len(v) >= 1 && v[0] == -2:
		return fmt.Errorf("stream end: %w", claim.ErrStreamOver)
	}
	return fmt.Errorf("stream end: %w", claim.ErrLeaseLost)
}

// StreamRead reads key's streamed value from byte from (the value's
// length when it was last read: Record.StreamLen, StreamPart.Next), about
// max bytes; a sealed stream's chunks come opened, whole (a chunk longer
// than max takes a second round trip). Gone (nil) and not a stream are
// ErrCorrupt-free errors: ErrLeaseLost.
func (s *Store) StreamRead(ctx context.Context, key string, from, max int) (claim.StreamPart, error) {
	return s.codec.ReadStream(key, from, max, func(from, max int) (claim.StreamPart, string, []byte, error) {
		return s.streamRead(ctx, key, from, max)
	})
}

// streamRead is one read of key's streamed value: its length and end so
// far, its fixed part and the bytes from from.
func (s *Store) streamRead(ctx context.Context, key string, from, max int) (claim.StreamPart, string, []byte, error) {
	run := s.eval(ctx, streamReadScript, key, 0, from, max)
	if err := run.Err(); err != nil {
		return claim.StreamPart{}, "", nil, s.unavailable("stream read", err)
	}
	v, _ := run.Slice()
	if len(v) != 4 {
		return claim.StreamPart{}, "", nil, fmt.Errorf("stream read: %w", claim.ErrLeaseLost)
	}
	head, _ := v[0].(string)
	n, _ := v[1].(int64)
	data, _ := v[2].(string)
	now, _ := v[3].(int64)
	end, ok := claim.StreamState(head, now)
	if !ok {
		return claim.StreamPart{}, "", nil, fmt.Errorf("stream read: %w", claim.ErrLeaseLost)
	}
	return claim.StreamPart{Len: int(n), End: end}, head, []byte(data), nil
}
