package claim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Streamed records (store.record_format 4): an answer relayed as it
// arrives is stored in the claim's own key, its status and headers first
// (StreamStart replaces the owner's claim with them), then every chunk
// appended before any reader sees it (StreamAppend), then how it ended
// (StreamEnd). Readers follow the key's growing value (StreamRead). The
// layout, after the fixed header every record has (version, state 3,
// flags, token, fingerprint, created; the completed slot holds, while the
// stream runs, when its owner's lease ends on Redis' clock, then when it
// ended; the status slot its status):
//
//	byte 69       how it ended: StreamRunning, StreamEnded, StreamAborted, StreamTooLarge
//	bytes 70..73  N, the length of the head's fields (big-endian)
//	74..74+N      request id, headers, trace context (flagTrace)
//	74+N..        the chunks, as the client got them
//
// Releases before v0.6.0 refuse state 3 as unreadable, so streamed
// records are written only under record_format 4. No script frees,
// settles as an orphan or takes over a streamed record, and its TTL is
// the retention from its first write: it never lapses into a second
// execution.

// Streamed is the state of a streamed record.
const Streamed State = 3

// StreamEnd is how a streamed answer ended, so far.
type StreamEnd byte

// How a stream ended.
const (
	StreamRunning  StreamEnd = 0 // its owner is still relaying it
	StreamEnded    StreamEnd = 1 // it ended as the upstream ended it
	StreamAborted  StreamEnd = 2 // it broke off: readers end it abnormally
	StreamTooLarge StreamEnd = 3 // past max_response_body: not replayable
)

func (e StreamEnd) String() string {
	switch e {
	case StreamRunning:
		return "running"
	case StreamEnded:
		return "ended"
	case StreamAborted:
		return "aborted"
	case StreamTooLarge:
		return "too_large"
	}
	return fmt.Sprintf("stream_end(%d)", byte(e))
}

const (
	offStreamEnd  = headerLen
	offStreamHead = headerLen + 1
	streamPrefix  = headerLen + 5
)

// ErrStreamOver means a stream takes no more chunks: it ended, or its
// owner's lease ran out (the stream then counts as aborted).
var ErrStreamOver = errors.New("claim: the stream is over")

// StreamLengthError is StreamAppend's answer when the stored value is not
// as long as the caller expected: an append resent after a lost reply
// (Len is then the caller's at plus its chunk), or a writer out of step.
type StreamLengthError struct{ Len int }

func (e *StreamLengthError) Error() string {
	return fmt.Sprintf("claim: the stream's stored length is %d, not the expected one", e.Len)
}

// encodeStreamHead is the value a stream starts with: rec's fixed header
// (State Streamed, status), its request id, headers and trace.
func (r *Record) encodeStreamHead() []byte {
	b := make([]byte, streamPrefix, streamPrefix+64+len(r.RequestID)+int(headerBytes(r.Header)))
	b[offVersion] = version
	b[offState] = byte(Streamed)
	if r.KeyedFingerprint {
		b[offFlags] |= flagKeyedFingerprint
	}
	copy(b[offToken:], r.Token[:])
	copy(b[offFingerprint:], r.Fingerprint[:])
	binary.BigEndian.PutUint64(b[offCreated:], uint64(unixMilli(r.Created)))
	binary.BigEndian.PutUint16(b[offStatus:], uint16(r.Status))
	b = appendString(b, r.RequestID)
	b = appendHeader(b, r.Header)
	b = r.appendTrace(b)
	binary.BigEndian.PutUint32(b[offStreamHead:], uint32(len(b)-streamPrefix))
	return b
}

func headerBytes(h http.Header) int64 {
	n := 0
	for k, vs := range h {
		n += len(k) + 4
		for _, v := range vs {
			n += len(v) + 2
		}
	}
	return int64(n)
}

// decodeStream parses a streamed record: its head, and the chunks so far
// as Body.
func decodeStream(r *Record, b []byte) (*Record, error) {
	if len(b) < streamPrefix || b[offFlags]&^(flagKeyedFingerprint|flagTrace) != 0 {
		return nil, ErrCorrupt
	}
	r.Created = fromMilli(int64(binary.BigEndian.Uint64(b[offCreated:])))
	until := fromMilli(int64(binary.BigEndian.Uint64(b[offCompleted:])))
	r.Status = int(binary.BigEndian.Uint16(b[offStatus:]))
	r.StreamEnd = StreamEnd(b[offStreamEnd])
	if r.StreamEnd == StreamRunning {
		r.AliveUntil = until
	} else {
		r.Completed = until
	}
	copy(r.Fingerprint[:], b[offFingerprint:])
	n := int(binary.BigEndian.Uint32(b[offStreamHead:]))
	if r.StreamEnd > StreamTooLarge || r.Status < 100 || r.Status > 999 || n > len(b)-streamPrefix {
		return nil, ErrCorrupt
	}
	d := decoder{b: b[streamPrefix : streamPrefix+n]}
	r.RequestID = d.string()
	r.Header = d.header()
	if b[offFlags]&flagTrace != 0 {
		copy(r.Trace.TraceID[:], d.bytes(16))
		copy(r.Trace.SpanID[:], d.bytes(8))
	}
	if d.bad || len(d.b) != 0 {
		return nil, ErrCorrupt
	}
	r.Body = b[streamPrefix+n:]
	r.StreamLen = len(b)
	return r, nil
}

// StreamStart replaces the owner's in-progress claim (rec's token) with
// the head of a streamed answer (rec: State Streamed, Status, Header),
// kept for retention from now; the owner's lease, lease from now, is
// what readers take for it being alive. It returns the value's length,
// where the first chunk goes. ErrLeaseLost: the claim is not rec's.
func (s *Store) StreamStart(ctx context.Context, key string, rec *Record, retention, lease time.Duration) (int, error) {
	value := s.stored(rec).encodeStreamHead()
	if s.seal != nil {
		value = s.seal.sealStreamHead(key, value)
	}
	run, wait := s.evalWrite(ctx, streamStartScript, key, len(value), rec.Token[:], value, retention.Milliseconds(), lease.Milliseconds(), s.watch.publishCommand())
	n, err := run.Int64()
	if err != nil {
		return 0, s.unavailable("stream start", err)
	}
	if n < 1 {
		return 0, fmt.Errorf("stream start: %w", ErrLeaseLost)
	}
	s.checkWait("complete", wait)
	return len(value), nil
}

// StreamAppend appends data to token's running stream, whose stored value
// must be at bytes long, and renews its owner's lease (an empty data is a
// renewal alone). It returns the new length. ErrLeaseLost: not token's;
// ErrStreamOver: ended, or the lease ran out first; *StreamLengthError:
// the stored value is of another length (nothing appended).
func (s *Store) StreamAppend(ctx context.Context, key string, token Token, at int, data []byte, lease time.Duration) (int, error) {
	if s.seal != nil && len(data) > 0 {
		data = s.seal.sealFrame(key, token, at, frameData, data)
	}
	run, wait := s.evalWrite(ctx, streamAppendScript, key, len(data), token[:], at, data, lease.Milliseconds(), s.watch.publishCommand())
	v, err := run.Int64Slice()
	if err != nil {
		return 0, s.unavailable("stream append", err)
	}
	switch {
	case len(v) == 2 && v[0] == 1:
		s.checkWait("complete", wait)
		return int(v[1]), nil
	case len(v) == 2 && v[0] == -5 && int(v[1]) == at+len(data) && len(data) > 0:
		// Resent after its reply was lost: the first send landed (only
		// the token's owner appends, one append at a time).
		return at + len(data), nil
	case len(v) == 2 && v[0] == -5:
		return 0, &StreamLengthError{Len: int(v[1])}
	case len(v) >= 1 && (v[0] == -2 || v[0] == -3):
		return 0, fmt.Errorf("stream append: %w", ErrStreamOver)
	}
	return 0, fmt.Errorf("stream append: %w", ErrLeaseLost)
}

// StreamFinish records how token's running stream ended. StreamEnded is
// fenced on the stored length being at (every chunk the client got is
// there); the abnormal ends take any length (at < 0).
func (s *Store) StreamFinish(ctx context.Context, key string, token Token, end StreamEnd, at int) error {
	var last []byte // a sealed stream's end frame (streamseal.go)
	if s.seal != nil && end == StreamEnded && at >= 0 {
		last = s.seal.sealFrame(key, token, at, frameEnd, nil)
	}
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
		return &StreamLengthError{Len: int(v[1])}
	case len(v) >= 1 && v[0] == -2:
		return fmt.Errorf("stream end: %w", ErrStreamOver)
	}
	return fmt.Errorf("stream end: %w", ErrLeaseLost)
}

// StreamPart is what StreamRead found: the chunks' bytes from the offset
// asked for, the offset to read from next, the value's length, and how
// the stream ended so far (a running stream whose owner's lease ran out,
// on Redis' clock, is StreamAborted). Next is Len once everything stored
// was read.
type StreamPart struct {
	Data []byte
	Next int
	Len  int
	End  StreamEnd
}

// StreamRead reads key's streamed value from byte from (the value's
// length when it was last read: Record.StreamLen, StreamPart.Next), about
// max bytes; a sealed stream's chunks come opened, whole (a chunk longer
// than max takes a second round trip). Gone (nil) and not a stream are
// ErrCorrupt-free errors: ErrLeaseLost.
func (s *Store) StreamRead(ctx context.Context, key string, from, max int) (StreamPart, error) {
	p, head, data, err := s.streamRead(ctx, key, from, max)
	if err != nil || head[offFlags]&flagSealed == 0 {
		if err == nil && s.seal != nil && s.seal.required {
			return StreamPart{}, &RecordError{ReasonUnsealed}
		}
		p.Data, p.Next = data, from+len(data)
		return p, err
	}
	if s.seal == nil {
		return StreamPart{}, &RecordError{ReasonNoKeys}
	}
	var token Token
	copy(token[:], head[offToken:])
	plain, used, need, end, err := s.seal.openFrames(key, token, from, data)
	if err == nil && used == 0 && need > 0 && from+need <= p.Len {
		// One chunk longer than max: read it whole.
		if p, _, data, err = s.streamRead(ctx, key, from, need); err == nil {
			plain, used, _, end, err = s.seal.openFrames(key, token, from, data)
		}
	}
	if err != nil {
		return StreamPart{}, err
	}
	p.Data, p.Next = plain, from+used
	if end && (p.End != StreamEnded || p.Next != p.Len) || !end && p.End == StreamEnded && p.Next == p.Len {
		// The end byte and the end frame, which a normal end writes in
		// one script, disagree: an end byte set by hand over a stream
		// that broke off. (A reader past the end frame has returned: it
		// read the end with it.)
		return StreamPart{}, &RecordError{ReasonTampered}
	}
	return p, nil
}

// streamRead is one read of key's streamed value: its length and end so
// far, its fixed part and the bytes from from.
func (s *Store) streamRead(ctx context.Context, key string, from, max int) (StreamPart, string, []byte, error) {
	run := s.eval(ctx, streamReadScript, key, 0, from, max)
	if err := run.Err(); err != nil {
		return StreamPart{}, "", nil, s.unavailable("stream read", err)
	}
	v, _ := run.Slice()
	if len(v) != 4 {
		return StreamPart{}, "", nil, fmt.Errorf("stream read: %w", ErrLeaseLost)
	}
	head, _ := v[0].(string)
	n, _ := v[1].(int64)
	data, _ := v[2].(string)
	now, _ := v[3].(int64)
	if len(head) < streamPrefix || head[offVersion] != version || State(head[offState]) != Streamed {
		return StreamPart{}, "", nil, fmt.Errorf("stream read: %w", ErrLeaseLost)
	}
	p := StreamPart{Len: int(n), End: StreamEnd(head[offStreamEnd])}
	if p.End == StreamRunning && int64(binary.BigEndian.Uint64([]byte(head[offCompleted:offCompleted+8]))) < now {
		p.End = StreamAborted // its owner is gone: nothing more can be appended
	}
	return p, head, []byte(data), nil
}
