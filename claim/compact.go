package claim

import (
	"encoding/binary"
	"net/http"
	"strconv"
	"time"
)

// The compact layout of a completed record (store.record_format 3). A
// completed record is what Redis holds for a retention, so its bytes are
// the bill: an empty answer cost 376 bytes in Redis with the fixed layout,
// 240 of them the value's allocation (docs/scaling.md). The compact layout
// keeps the 19 bytes the scripts fence on (version, state, flags, token),
// so every script reads it unchanged, and the 32-byte fingerprint; after
// them it writes:
//
//	created        uvarint, Unix milliseconds
//	completed      zigzag varint, milliseconds after created
//	status         uvarint
//	request id     uvarint n<<1|packed, then n bytes; packed: n raw bytes
//	               that are the id's 2n lowercase hex digits
//	header count   uvarint, then per name:
//	  name         uvarint: an index into commonNames from 1, or 0 and
//	               the name as a string
//	  value count  uvarint, then per value a uvarint tag whose low three
//	               bits say how the value is written (valueLiteral...)
//	body           uvarint length, bytes
//	trace          as in the fixed layout, when flagTrace is set
//
// Every value is written so that it decodes to exactly the bytes it was:
// a Date is packed only when formatting it back gives the same string, a
// number only in its canonical decimal form. Replays stay byte for byte.
// Releases before v0.5.0 refuse the flag, so it is written only once every
// replica reads it; sealed records keep the fixed layout (their header is
// the sealing's additional data).

// WithCompactRecords writes completed records in the compact layout.
// Records written so are read only by v0.5.0 and later: give it once
// every replica runs one (store.record_format 3).
func WithCompactRecords() Option {
	return func(o *Options) { o.codec.compact = true }
}

// flagCompact marks a completed record in the compact layout.
const flagCompact = 64

// compactPrefix is the part of the fixed header the compact layout keeps.
const compactPrefix = offFingerprint + len(Fingerprint{})

// commonNames are header names an answer usually carries, written as
// their index. The order is part of the stored format: append only.
var commonNames = [...]string{
	"Content-Type", "Content-Length", "Date", "X-Request-Id", "Cache-Control",
	"Content-Encoding", "Etag", "Last-Modified", "Location", "Set-Cookie",
	"Vary", "Expires", "Pragma", "X-Content-Type-Options", "Strict-Transport-Security",
	"Idempotency-Key", "Content-Language", "Link", "Retry-After", "Access-Control-Allow-Origin",
}

// commonValues are header values written as their index. Append only.
var commonValues = [...]string{
	"application/json", "application/json; charset=utf-8", "text/plain; charset=utf-8",
	"application/problem+json", "text/html; charset=utf-8", "no-store", "no-cache", "nosniff",
	"application/xml", "text/xml; charset=utf-8", "Accept-Encoding", "gzip", "0",
}

// How a header value is written: the low three bits of its tag.
const (
	valueLiteral   = 0 // tag>>3 is the length; the bytes follow
	valueNumber    = 1 // tag>>3 is the number, in canonical decimal
	valueDate      = 2 // an HTTP date, tag>>3 zigzag seconds after created
	valueRequestID = 3 // the record's request id
	valueCommon    = 4 // tag>>3 indexes commonValues
	valueKindBits  = 3
)

var (
	nameIndex  = indexOf(commonNames[:])
	valueIndex = indexOf(commonValues[:])
)

func indexOf(list []string) map[string]int {
	m := make(map[string]int, len(list))
	for i, s := range list {
		m[s] = i + 1
	}
	return m
}

// appendCompact appends r's compact form (the header prefix already in b).
func (r *Record) appendCompact(b []byte) []byte {
	b = append(b, r.Fingerprint[:]...)
	created := unixMilli(r.Created)
	b = binary.AppendUvarint(b, uint64(created))
	b = binary.AppendVarint(b, unixMilli(r.Completed)-created)
	b = binary.AppendUvarint(b, uint64(r.Status))
	if isLowerHex(r.RequestID) {
		b = binary.AppendUvarint(b, uint64(len(r.RequestID)/2)<<1|1)
		b = appendPackedHex(b, r.RequestID)
	} else {
		b = binary.AppendUvarint(b, uint64(len(r.RequestID))<<1)
		b = append(b, r.RequestID...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for k, vs := range r.Header {
		if i, ok := nameIndex[k]; ok {
			b = binary.AppendUvarint(b, uint64(i))
		} else {
			b = binary.AppendUvarint(b, 0)
			b = appendString(b, k)
		}
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = r.appendValue(b, v, created)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	return append(b, r.Body...)
}

func (r *Record) appendValue(b []byte, v string, created int64) []byte {
	tag := func(kind int, n uint64) []byte { return binary.AppendUvarint(b, n<<valueKindBits|uint64(kind)) }
	if i, ok := valueIndex[v]; ok {
		return tag(valueCommon, uint64(i))
	}
	if v != "" && v == r.RequestID {
		return tag(valueRequestID, 0)
	}
	if n, err := strconv.ParseUint(v, 10, 56); err == nil && strconv.FormatUint(n, 10) == v {
		return tag(valueNumber, n)
	}
	if len(v) == len(http.TimeFormat) {
		if t, err := time.Parse(http.TimeFormat, v); err == nil && t.Format(http.TimeFormat) == v {
			return tag(valueDate, zigzag(t.Unix()-created/1000))
		}
	}
	b = tag(valueLiteral, uint64(len(v)))
	return append(b, v...)
}

// decodeCompact parses the compact part of b into r, after the prefix.
func decodeCompact(r *Record, b []byte) (rest []byte, ok bool) {
	if len(b) < compactPrefix {
		return nil, false
	}
	copy(r.Fingerprint[:], b[offFingerprint:])
	d := decoder{b: b[compactPrefix:]}
	created := int64(d.uvarint())
	completed := d.varint()
	if created < 0 || created > 1<<50 || completed < -1<<40 || completed > 1<<40 {
		return nil, false
	}
	r.Created, r.Completed = fromMilli(created), fromMilli(created+completed)
	status := d.uvarint()
	if status > 999 {
		return nil, false
	}
	r.Status = int(status)
	idTag := d.uvarint()
	if idTag>>1 > uint64(len(d.b)) {
		return nil, false
	}
	if id := d.bytes(int(idTag >> 1)); idTag&1 == 1 {
		r.RequestID = unpackHex(id)
	} else {
		r.RequestID = string(id)
	}
	if nh := d.count(); nh > 0 {
		r.Header = make(http.Header, nh)
		for range nh {
			var k string
			switch i := d.uvarint(); {
			case i == 0:
				k = d.string()
			case i <= uint64(len(commonNames)):
				k = commonNames[i-1]
			default:
				return nil, false
			}
			nv := d.count()
			vs := make([]string, 0, min(nv, 16))
			for range nv {
				v, ok := r.value(&d, created)
				if !ok {
					return nil, false
				}
				vs = append(vs, v)
			}
			r.Header[k] = vs
		}
	}
	if n := d.count(); n > 0 {
		r.Body = d.bytes(n)
	}
	return d.b, !d.bad
}

func (r *Record) value(d *decoder, created int64) (string, bool) {
	tag := d.uvarint()
	n := tag >> valueKindBits
	switch tag & (1<<valueKindBits - 1) {
	case valueLiteral:
		if n > uint64(len(d.b)) {
			return "", false
		}
		return string(d.bytes(int(n))), !d.bad
	case valueNumber:
		return strconv.FormatUint(n, 10), !d.bad
	case valueDate:
		sec := created/1000 + unzigzag(n)
		return time.Unix(sec, 0).UTC().Format(http.TimeFormat), !d.bad && sec > -1<<40 && sec < 1<<40
	case valueRequestID:
		return r.RequestID, !d.bad && n == 0
	case valueCommon:
		if n == 0 || n > uint64(len(commonValues)) {
			return "", false
		}
		return commonValues[n-1], !d.bad
	}
	return "", false
}

func (d *decoder) varint() int64 {
	return unzigzag(d.uvarint())
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// isLowerHex reports whether s is an even number of lowercase hex digits
// (the sidecar's own request ids are 32 of them).
func isLowerHex(s string) bool {
	if len(s) == 0 || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if _, ok := fromHex(s[i]); !ok {
			return false
		}
	}
	return true
}

// appendPackedHex appends the bytes whose hex digits are s (isLowerHex).
func appendPackedHex(b []byte, s string) []byte {
	for i := 0; i < len(s); i += 2 {
		hi, _ := fromHex(s[i])
		lo, _ := fromHex(s[i+1])
		b = append(b, hi<<4|lo)
	}
	return b
}

func fromHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func unpackHex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 2*len(b))
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}
