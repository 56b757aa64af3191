package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// StreamStart replaces the owner's claim with the head of its streamed
// answer (claim.Streams); it returns where the first chunk goes.
func (s *Store) StreamStart(ctx context.Context, key string, rec *claim.Record, retention, lease time.Duration) (int, error) {
	value := s.codec.StreamHead(key, rec)
	var n int
	if err := s.do(ctx, "stream start", "idem_stream_start", key, true, []any{key, rec.Token[:], value, retention.Milliseconds(), lease.Milliseconds(), s.rows}, &n); err != nil {
		return 0, err
	}
	if n < 1 {
		return 0, fmt.Errorf("stream start: %w", claim.ErrLeaseLost)
	}
	return len(value), nil
}

// StreamAppend appends data to token's running stream at byte at and
// renews its owner's lease (claim.Streams).
func (s *Store) StreamAppend(ctx context.Context, key string, token claim.Token, at int, data []byte, lease time.Duration) (int, error) {
	data = s.codec.Chunk(key, token, at, data)
	if data == nil {
		data = []byte{}
	}
	var res int
	var n *int64
	args := []any{key, token[:], at, data, lease.Milliseconds(), s.rows}
	var err error
	if len(data) == 0 { // a renewal: nothing for a reader to read, no wake-up
		err = s.do(ctx, "stream append", "idem_stream_append", key, false, args, &res, &n)
	} else {
		err = s.do(ctx, "stream append", "idem_stream_append", key, true, args, &res, &n)
	}
	if err != nil {
		return 0, err
	}
	switch {
	case res == 1 && n != nil:
		return int(*n), nil
	case res == -5 && n != nil && int(*n) == at+len(data) && len(data) > 0:
		return at + len(data), nil // resent after its reply was lost: the first send landed
	case res == -5 && n != nil:
		return 0, &claim.StreamLengthError{Len: int(*n)}
	case res == -2 || res == -3:
		return 0, fmt.Errorf("stream append: %w", claim.ErrStreamOver)
	}
	return 0, fmt.Errorf("stream append: %w", claim.ErrLeaseLost)
}

// StreamFinish records how token's running stream ended (claim.Streams).
func (s *Store) StreamFinish(ctx context.Context, key string, token claim.Token, end claim.StreamEnd, at int) error {
	last := s.codec.EndFrame(key, token, end, at)
	var res int
	var n *int64
	if err := s.do(ctx, "stream end", "idem_stream_end", key, true, []any{key, token[:], int(end), at, last, s.rows}, &res, &n); err != nil {
		return err
	}
	switch {
	case res == 1:
		return nil
	case res == -5 && n != nil:
		return &claim.StreamLengthError{Len: int(*n)}
	case res == -2:
		return fmt.Errorf("stream end: %w", claim.ErrStreamOver)
	}
	return fmt.Errorf("stream end: %w", claim.ErrLeaseLost)
}

// StreamRead reads key's streamed value from byte from, about max bytes,
// opened (claim.Streams).
func (s *Store) StreamRead(ctx context.Context, key string, from, max int) (claim.StreamPart, error) {
	return s.codec.ReadStream(key, from, max, func(from, max int) (claim.StreamPart, string, []byte, error) {
		var head, data []byte
		var n, nowMS int64
		if err := s.do(ctx, "stream read", "idem_stream_read", key, false, []any{key, from, max}, &head, &n, &data, &nowMS); err != nil {
			return claim.StreamPart{}, "", nil, err
		}
		end, ok := claim.StreamState(string(head), nowMS)
		if !ok {
			return claim.StreamPart{}, "", nil, fmt.Errorf("stream read: %w", claim.ErrLeaseLost)
		}
		return claim.StreamPart{Len: int(n), End: end}, string(head), data, nil
	})
}
