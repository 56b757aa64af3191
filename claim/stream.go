package claim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
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

// StreamHead is rec's stream head as stored under key (sealed when
// sealing is on): what a streamed value begins with.
func (c *Codec) StreamHead(key string, rec *Record) []byte {
	value := c.stored(rec).encodeStreamHead()
	if c.seal != nil {
		value = c.seal.sealStreamHead(key, value)
	}
	return value
}

// Chunk is data as stored when appended at byte at of token's stream
// under key: a sealed frame when sealing is on.
func (c *Codec) Chunk(key string, token Token, at int, data []byte) []byte {
	if c.seal != nil && len(data) > 0 {
		return c.seal.sealFrame(key, token, at, frameData, data)
	}
	return data
}

// EndFrame is what a stream's end appends at byte at: a sealed stream's
// end frame for a normal end (at >= 0), nil otherwise.
func (c *Codec) EndFrame(key string, token Token, end StreamEnd, at int) []byte {
	if c.seal != nil && end == StreamEnded && at >= 0 {
		return c.seal.sealFrame(key, token, at, frameEnd, nil)
	}
	return nil
}

// StreamState is how the stream whose stored head is head has ended so
// far, the store's clock reading nowMS (Unix ms): a running stream whose
// owner's lease ran out is StreamAborted. ok is false when head is not a
// stream's.
func StreamState(head string, nowMS int64) (end StreamEnd, ok bool) {
	if len(head) < streamPrefix || head[offVersion] != version || State(head[offState]) != Streamed {
		return 0, false
	}
	end = StreamEnd(head[offStreamEnd])
	if end == StreamRunning && int64(binary.BigEndian.Uint64([]byte(head[offCompleted:offCompleted+8]))) < nowMS {
		end = StreamAborted // its owner is gone: nothing more can be appended
	}
	return end, true
}

// ReadStream is a backend's StreamRead: read returns what one read of
// key's streamed value found (its length and end so far), its head and
// its stored bytes from from, about max; ReadStream opens a sealed
// stream's frames, whole (a frame longer than max takes a second read).
func (c *Codec) ReadStream(key string, from, max int, read func(from, max int) (StreamPart, string, []byte, error)) (StreamPart, error) {
	p, head, data, err := read(from, max)
	if err != nil || head[offFlags]&flagSealed == 0 {
		if err == nil && c.seal != nil && c.seal.required {
			return StreamPart{}, &RecordError{ReasonUnsealed}
		}
		p.Data, p.Next = data, from+len(data)
		return p, err
	}
	if c.seal == nil {
		return StreamPart{}, &RecordError{ReasonNoKeys}
	}
	var token Token
	copy(token[:], head[offToken:])
	plain, used, need, end, err := c.seal.openFrames(key, token, from, data)
	if err == nil && used == 0 && need > 0 && from+need <= p.Len {
		// One chunk longer than max: read it whole.
		if p, _, data, err = read(from, need); err == nil {
			plain, used, _, end, err = c.seal.openFrames(key, token, from, data)
		}
	}
	if err != nil {
		return StreamPart{}, err
	}
	p.Data, p.Next = plain, from+used
	if end && (p.End != StreamEnded || p.Next != p.Len) || !end && p.End == StreamEnded && p.Next == p.Len {
		// The end byte and the end frame, which a normal end writes in
		// one write, disagree: an end byte set by hand over a stream that
		// broke off. (A reader past the end frame has returned: it read
		// the end with it.)
		return StreamPart{}, &RecordError{ReasonTampered}
	}
	return p, nil
}
