package claim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// State is where a claimed key is in its life.
type State byte

// States of a record. The numeric values are part of the stored format and
// of the Lua scripts, which read the state byte directly.
const (
	InProgress State = 1 // the owner is forwarding to the upstream
	Completed  State = 2 // the settled response is stored
)

func (s State) String() string {
	switch s {
	case InProgress:
		return "in_progress"
	case Completed:
		return "completed"
	case Streamed:
		return "streamed"
	}
	return fmt.Sprintf("state(%d)", byte(s))
}

// Token is an owner's random fencing token.
type Token [16]byte

// Fingerprint is the SHA-256 of the request a key was first used for.
type Fingerprint [32]byte

// version is the first byte of every stored value; a decoder seeing another
// version refuses the value instead of guessing.
const version byte = 1

// Fixed layout of the header of a stored value. The Lua scripts fence on
// bytes 1 (version), 2 (state) and 4..19 (token), 1-based.
const (
	offVersion     = 0
	offState       = 1
	offFlags       = 2
	offToken       = 3
	offFingerprint = offToken + len(Token{})
	offCreated     = offFingerprint + len(Fingerprint{})
	offCompleted   = offCreated + 8
	offStatus      = offCompleted + 8
	headerLen      = offStatus + 2
)

// Field is one fixed field of a stored value: its name, 0-based offset
// and length.
type Field struct {
	Name     string
	Off, Len int
}

// Fields are the fixed fields of a stored value that the backends'
// scripts read and fence on (the Lua scripts, schema.sql), declared here
// once: each backend's tests hold every offset its scripts spell out to
// them (contract.CheckOffsets). The mark is the top bits of the status
// slot's first byte (MarkSlot); a stream's end, its head's length and its
// head's end follow the header (stream.go).
func Fields() []Field {
	return []Field{
		{"version", offVersion, 1}, {"state", offState, 1}, {"flags", offFlags, 1},
		{"token", offToken, len(Token{})}, {"fingerprint", offFingerprint, len(Fingerprint{})},
		{"created", offCreated, 8}, {"completed", offCompleted, 8}, {"status", offStatus, 2},
		{"mark", offStatus, 1}, {"statusLow", offStatus + 1, 1},
		{"streamEnd", offStreamEnd, 1}, {"streamHeadLen", offStreamHead, 4},
		{"streamHead", 0, streamPrefix},
	}
}

// Flags, in the flags byte.
const (
	// flagBodyOmitted marks a completed record whose response body was
	// larger than the route's max_response_body and was not stored.
	flagBodyOmitted = 1
	// flagTail marks an in-progress record that outlives its lease: the
	// completed-time slot, unused while in progress, holds its Tail in
	// milliseconds.
	flagTail = 2
	// flagSealed marks a record whose response part is sealed (seal.go).
	flagSealed = 4
	// flagTrace marks a record that ends with the trace context of the
	// attempt that executed (Record.Trace). Written only with tracing on,
	// so that with it off records stay readable by earlier versions.
	flagTrace = 8
	// flagKeyedFingerprint marks a fingerprint stored as an HMAC under a
	// subkey of the key secret (store.record_format: 2): v0.3.0 refuses
	// the flag, so it is written only once every replica reads it.
	flagKeyedFingerprint = 16
	knownFlags           = flagBodyOmitted | flagTail | flagSealed | flagTrace | flagKeyedFingerprint | flagCompressed | flagCompact
)

// ErrCorrupt means a stored value could not be decoded: another program
// wrote under our prefix, or the format is from a newer version.
var ErrCorrupt = errors.New("claim: stored record is corrupt or of an unknown version")

// Record is the value stored under a claimed key.
type Record struct {
	State       State
	Token       Token
	Fingerprint Fingerprint
	Created     time.Time
	// Completed is zero while in progress.
	Completed time.Time
	// RequestID is the request id of the attempt that claimed the key, so
	// a replay can be traced to the original.
	RequestID string
	// Status, Header and Body are the settled response; set when Completed.
	Status int
	Header http.Header
	Body   []byte
	// BodyOmitted reports that the response was too large to store: a
	// retry cannot be answered with it and must not execute again either.
	BodyOmitted bool
	// Tail, set only while InProgress, is how long the record outlives
	// its owner's lease (unknown_outcome: fail): the key's TTL is lease +
	// Tail, so once at most Tail is left the owner stopped renewing, and
	// the next attempt settles the key as an unknown outcome instead of
	// executing. Zero: the record lapses with its lease.
	Tail time.Duration
	// Trace is the W3C trace id and span id of the attempt that claimed
	// the key, so that a retry's trace can link to the execution; zero
	// when that attempt was not traced.
	Trace TraceContext
	// KeyedFingerprint reports that Fingerprint is the keyed form (an
	// HMAC of the request's SHA-256): compare with Store.SameRequest.
	KeyedFingerprint bool
	// BodyCompressed reports that Body is zstd-compressed (compress.go):
	// reads leave it so, and Inflate decompresses it.
	BodyCompressed bool
	// Compact, for a completed record, is the compact layout
	// (compact.go, store.record_format 3): Encode writes it, Decode
	// reports it.
	Compact bool
	// Mark and Lease, in progress only, say whether the key's TTL was set
	// by the claim, with that lease, or by a renewal since (mark.go).
	// Claim writes MarkClaimed with the lease it was given; MarkNone is
	// written as nothing.
	Mark  Mark
	Lease time.Duration
	// ReadEpoch is not stored: set on a claim, it has the claim's round
	// trip read the epoch marker of its key's master as well, so that a
	// store that lost its data since the last look is known before
	// EpochStart answers for this claim (epoch.go).
	ReadEpoch bool
	// Expires is not stored: for an in-progress record read together
	// with its key's TTL and the store's clock (a claim that found it),
	// when the key expires on the store's clock; zero when not read. Only
	// a renewal moves it, whatever the store's clock does, so it is how a
	// reader tells an owner alive (proxy's liveness rule), and SettleOrphan
	// and TakeOver are fenced on it. ReadAt is the store's clock in the
	// same reading.
	Expires, ReadAt time.Time
	// StreamEnd, AliveUntil and StreamLen describe a Streamed record
	// (stream.go) as read: how it ended so far, until when (Redis'
	// clock) its owner's lease runs while it runs, and the stored value's
	// length, where a reader following it reads on. Body holds the chunks
	// so far.
	StreamEnd  StreamEnd
	AliveUntil time.Time
	StreamLen  int
}

// TraceContext is a W3C trace id (16 bytes) and span id (8 bytes).
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
}

// IsZero reports whether no trace context is set.
func (t TraceContext) IsZero() bool { return t == TraceContext{} }

// Orphaned reports whether r is an in-progress record that outlives its
// lease and whose lease, leaseLeft as Store reports it, has run out: its
// owner is gone and the outcome of its request is unknown.
func (r *Record) Orphaned(leaseLeft time.Duration) bool {
	return r.State == InProgress && r.Tail > 0 && leaseLeft <= 0
}

// Encode returns the versioned binary form of r.
func (r *Record) Encode() []byte { return r.encodeInto(nil) }

// encodeInto is Encode into buf's storage when it is large enough.
func (r *Record) encodeInto(buf []byte) []byte {
	n := headerLen + binary.MaxVarintLen64*2 + len(r.RequestID) + len(r.Body) + traceLen
	for k, vs := range r.Header {
		n += len(k) + 2*binary.MaxVarintLen64
		for _, v := range vs {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	b := slices.Grow(buf[:0], n)[:headerLen]
	clear(b)
	b[offVersion] = version
	b[offState] = byte(r.State)
	if r.BodyOmitted {
		b[offFlags] |= flagBodyOmitted
	}
	if r.KeyedFingerprint {
		b[offFlags] |= flagKeyedFingerprint
	}
	if r.BodyCompressed {
		b[offFlags] |= flagCompressed
	}
	copy(b[offToken:], r.Token[:])
	if r.Compact && r.State == Completed {
		b[offFlags] |= flagCompact
		b = r.appendCompact(b[:offFingerprint])
		return r.appendTrace(b)
	}
	copy(b[offFingerprint:], r.Fingerprint[:])
	binary.BigEndian.PutUint64(b[offCreated:], uint64(unixMilli(r.Created)))
	binary.BigEndian.PutUint64(b[offCompleted:], uint64(unixMilli(r.Completed)))
	if r.State == InProgress && r.Tail > 0 {
		b[offFlags] |= flagTail
		binary.BigEndian.PutUint64(b[offCompleted:], uint64(max(r.Tail.Milliseconds(), 1)))
	}
	if r.State == InProgress {
		binary.BigEndian.PutUint16(b[offStatus:], r.MarkSlot())
	} else {
		binary.BigEndian.PutUint16(b[offStatus:], uint16(r.Status))
	}
	b = appendString(b, r.RequestID)
	b = appendHeader(b, r.Header)
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	b = append(b, r.Body...)
	return r.appendTrace(b)
}

// appendTrace ends an encoded record with its trace context, if any.
func (r *Record) appendTrace(b []byte) []byte {
	if !r.Trace.IsZero() {
		b[offFlags] |= flagTrace
		b = append(b, r.Trace.TraceID[:]...)
		b = append(b, r.Trace.SpanID[:]...)
	}
	return b
}

const traceLen = 16 + 8

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// appendHeader writes h as decoder.header reads it.
func appendHeader(b []byte, h http.Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for k, vs := range h {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode parses a stored value that is not sealed. Any malformed input
// yields an error matching ErrCorrupt, never a panic or a partially filled
// record; a sealed value opens only through a Store with its key.
func Decode(b []byte) (*Record, error) {
	return (*sealer)(nil).open("", b)
}

// decode parses an unsealed value.
func decode(b []byte) (*Record, error) {
	if len(b) < compactPrefix || b[offVersion] != version || b[offFlags]&flagSealed != 0 || b[offFlags]&^knownFlags != 0 {
		return nil, ErrCorrupt
	}
	flags := b[offFlags]
	r := &Record{
		State:            State(b[offState]),
		BodyOmitted:      flags&flagBodyOmitted != 0,
		KeyedFingerprint: flags&flagKeyedFingerprint != 0,
		BodyCompressed:   flags&flagCompressed != 0,
		Compact:          flags&flagCompact != 0,
	}
	copy(r.Token[:], b[offToken:])
	if r.State == Streamed {
		return decodeStream(r, b)
	}
	var rest []byte
	var ok bool
	if r.Compact {
		if r.State != Completed || flags&flagTail != 0 {
			return nil, ErrCorrupt
		}
		rest, ok = decodeCompact(r, b)
	} else {
		rest, ok = decodeFixed(r, b)
	}
	if !ok {
		return nil, ErrCorrupt
	}
	d := decoder{b: rest}
	if flags&flagTrace != 0 {
		copy(r.Trace.TraceID[:], d.bytes(16))
		copy(r.Trace.SpanID[:], d.bytes(8))
	}
	if d.bad || len(d.b) != 0 {
		return nil, ErrCorrupt
	}
	if r.State == Completed && (r.Status < 100 || r.Status > 999) || r.BodyCompressed && (r.State != Completed || len(r.Body) == 0) {
		return nil, ErrCorrupt
	}
	return r, nil
}

// decodeFixed parses the fixed layout of b into r, returning what follows
// the body.
func decodeFixed(r *Record, b []byte) (rest []byte, ok bool) {
	if len(b) < headerLen {
		return nil, false
	}
	r.Created = fromMilli(int64(binary.BigEndian.Uint64(b[offCreated:])))
	r.Completed = fromMilli(int64(binary.BigEndian.Uint64(b[offCompleted:])))
	r.Status = int(binary.BigEndian.Uint16(b[offStatus:]))
	if r.State != InProgress && r.State != Completed {
		return nil, false
	}
	if r.State == InProgress {
		r.setMarkSlot(uint16(r.Status))
		r.Status = 0
	}
	if b[offFlags]&flagTail != 0 {
		tail := int64(binary.BigEndian.Uint64(b[offCompleted:]))
		if r.State != InProgress || tail <= 0 || tail > 1<<40 {
			return nil, false
		}
		r.Tail, r.Completed = time.Duration(tail)*time.Millisecond, time.Time{}
	}
	copy(r.Fingerprint[:], b[offFingerprint:])
	d := decoder{b: b[headerLen:]}
	r.RequestID = d.string()
	r.Header = d.header()
	if n := d.count(); n > 0 {
		r.Body = d.bytes(n)
	}
	return d.b, !d.bad
}

// decoder reads length-prefixed fields, remembering the first error so the
// caller checks once.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	if d.bad {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length or item count. Every item takes at least one byte,
// so a count beyond the bytes left is corrupt; checking it first keeps a
// hostile value from making the decoder allocate without limit.
func (d *decoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) {
		d.bad = true
		return 0
	}
	return int(v)
}

func (d *decoder) bytes(n int) []byte {
	if d.bad || n > len(d.b) {
		d.bad = true
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

// header reads a header map: its count, then each name and its values;
// nil when empty. A replay decodes one per request, so the names and
// values are cut from one string holding the whole block and share one
// slice (each name's values capped, so an append copies): three
// allocations, where a string and a slice each were one per field.
func (d *decoder) header() http.Header {
	scan := *d
	nh, nvals := scan.count(), 0
	for range nh {
		scan.bytes(scan.count())
		nv := scan.count()
		nvals += nv
		for range nv {
			scan.bytes(scan.count())
		}
	}
	if scan.bad {
		d.bad = true
		return nil
	}
	if nh == 0 {
		d.b = scan.b
		return nil
	}
	whole := len(d.b)
	text := string(d.b[:whole-len(scan.b)])
	cut := func() string { // the next field, as a part of text
		n := d.count()
		at := whole - len(d.b)
		d.bytes(n)
		return text[at : at+n]
	}
	d.count()
	h := make(http.Header, nh)
	vals := make([]string, 0, nvals)
	for range nh {
		k := cut()
		start := len(vals)
		for range d.count() {
			vals = append(vals, cut())
		}
		h[k] = vals[start:len(vals):len(vals)]
	}
	return h
}

func (d *decoder) string() string {
	return string(d.bytes(d.count()))
}
