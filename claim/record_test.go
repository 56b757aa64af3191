package claim

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"
)

func sampleRecord() *Record {
	r := &Record{
		State:     Completed,
		Created:   time.UnixMilli(1_700_000_000_123),
		Completed: time.UnixMilli(1_700_000_001_456),
		RequestID: "req-abc",
		Status:    201,
		Header:    http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}},
		Body:      []byte(`{"id":"ch_1"}`),
	}
	for i := range r.Token {
		r.Token[i] = byte(i + 1)
	}
	for i := range r.Fingerprint {
		r.Fingerprint[i] = byte(255 - i)
	}
	return r
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []*Record{
		sampleRecord(),
		{State: InProgress, Created: time.UnixMilli(5), RequestID: "x"},
		{State: InProgress, Created: time.UnixMilli(5), RequestID: "x", Tail: 24 * time.Hour},
		{State: Completed, Status: 204, BodyOmitted: true, Created: time.UnixMilli(5), Completed: time.UnixMilli(6)},
	} {
		got, err := Decode(r.Encode())
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, r)
		}
	}
}

// A decoded header's names and values share one string and one slice
// (allocation budget, issue 45); a value appended to one name must not
// land in the next name's values.
func TestDecodedHeaderValuesAreSeparate(t *testing.T) {
	r := sampleRecord()
	r.Header = http.Header{"A": {"1"}, "B": {"2"}, "C": {"3", "4"}}
	got, err := Decode(r.Encode())
	if err != nil {
		t.Fatal(err)
	}
	for k := range got.Header {
		got.Header[k] = append(got.Header[k], "added to "+k)
	}
	want := http.Header{"A": {"1", "added to A"}, "B": {"2", "added to B"}, "C": {"3", "4", "added to C"}}
	if !reflect.DeepEqual(got.Header, want) {
		t.Fatalf("after appending to each name's values: %v, want %v", got.Header, want)
	}
}

// The Lua scripts read the state and token at fixed offsets.
func TestRecordLayoutForScripts(t *testing.T) {
	r := sampleRecord()
	b := r.Encode()
	if b[0] != 1 || b[1] != byte(Completed) || !bytes.Equal(b[3:19], r.Token[:]) {
		t.Fatalf("header bytes %x do not match the layout the scripts read", b[:19])
	}
}

func TestDecodeRejectsCorruptValues(t *testing.T) {
	valid := sampleRecord().Encode()
	for n := range len(valid) {
		if _, err := Decode(valid[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: err = %v, want ErrCorrupt", n, err)
		}
	}
	cases := map[string][]byte{
		"empty":          nil,
		"other version":  append([]byte{2}, valid[1:]...),
		"unknown state":  append([]byte{1, 9}, valid[2:]...),
		"unknown flag":   append([]byte{1, 2, 0x80}, valid[3:]...),
		"trailing bytes": append(append([]byte{}, valid...), 0),
		"plain text":     []byte("hello world, this is not a record of ours at all......................"),
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", name, err)
		}
	}
	// A length prefix promising far more than the value holds.
	huge := append([]byte{}, valid[:headerLen]...)
	huge = append(huge, 0xff, 0xff, 0xff, 0xff, 0x0f)
	if _, err := Decode(huge); !errors.Is(err, ErrCorrupt) {
		t.Errorf("huge length: err = %v, want ErrCorrupt", err)
	}
}

// A record carries the executing attempt's trace context only when it has
// one: without it the encoding is what versions before tracing wrote and
// read, so records stay readable across a rolling upgrade while tracing is
// off.
func TestRecordTraceContext(t *testing.T) {
	r := sampleRecord()
	r.Header = http.Header{"Content-Type": {"application/json"}} // one key: a deterministic encoding
	plain := r.Encode()
	if plain[offFlags]&flagTrace != 0 {
		t.Fatal("a record without trace context is flagged as having one")
	}
	r.Trace = TraceContext{TraceID: [16]byte{1, 2, 3}, SpanID: [8]byte{4, 5, 6}}
	traced := r.Encode()
	if !bytes.Equal(traced[:len(plain)], withFlag(plain, flagTrace)) || len(traced) != len(plain)+traceLen {
		t.Fatal("the trace context is not a flag and a suffix of the untraced encoding")
	}
	got, err := decode(traced)
	if err != nil {
		t.Fatal(err)
	}
	if got.Trace != r.Trace {
		t.Errorf("trace context = %+v, want %+v", got.Trace, r.Trace)
	}
	if _, err := decode(traced[:len(traced)-1]); !errors.Is(err, ErrCorrupt) {
		t.Errorf("truncated trace context decoded: %v", err)
	}
}

func withFlag(b []byte, f byte) []byte {
	c := bytes.Clone(b)
	c[offFlags] |= f
	return c
}

// encodeInto reuses a pooled buffer: whatever it held before must not
// leak into the encoding.
func TestEncodeIntoADirtyBuffer(t *testing.T) {
	one := sampleRecord()
	one.Header = http.Header{"Content-Type": {"application/json"}} // one key: a deterministic encoding
	for _, r := range []*Record{one, {State: InProgress, Tail: time.Second, RequestID: "r"}} {
		dirty := bytes.Repeat([]byte{0xff}, 4096)
		if got, want := r.encodeInto(dirty), r.Encode(); !bytes.Equal(got, want) {
			t.Errorf("encoding into a used buffer:\n got %x\nwant %x", got, want)
		}
	}
}

// compactSample is an empty answer as the sidecar stores it: the request
// id it generated, the four headers an upstream's empty answer replays.
func compactSample() *Record {
	r := sampleRecord()
	r.RequestID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	r.Header = http.Header{
		"Content-Type":   {"text/plain; charset=utf-8"},
		"Content-Length": {"0"},
		"Date":           {"Tue, 01 Dec 2026 18:18:44 GMT"},
		"X-Request-Id":   {r.RequestID},
	}
	r.Body = nil
	r.Compact = true
	return r
}

// The compact layout gives back exactly what it was given, whatever the
// values: a value is packed only when it unpacks to the same bytes.
func TestCompactRecordRoundTrip(t *testing.T) {
	odd := compactSample()
	odd.RequestID = "0F1E2D3C" // upper case: not packed
	odd.Header = http.Header{
		"Date":           {"Tue, 1 Dec 2026 18:18:44 GMT", "Mon, 02 Jan 2006 15:04:05 GMT", "Sat, 01 Jan 1966 00:00:00 GMT"},
		"Content-Length": {"007", "+5", "18446744073709551615", "72057594037927935", ""},
		"X-Request-Id":   {"0f1e2d3c"},
		"Etag":           {`"abc"`},
		"X-Custom":       {"application/json", "gzip", "0"},
	}
	odd.Body = []byte("body")
	odd.Trace = TraceContext{TraceID: [16]byte{1}, SpanID: [8]byte{2}}
	odd.KeyedFingerprint = true
	odd.Created = time.UnixMilli(1_700_000_000_123)
	odd.Completed = odd.Created.Add(-3 * time.Second) // a clock step backwards
	omitted := compactSample()
	omitted.BodyOmitted, omitted.RequestID, omitted.Header = true, "", nil
	cases := []*Record{compactSample(), odd, omitted, {State: Completed, Status: 200, Compact: true}}
	for _, r := range cases {
		b := r.Encode()
		if b[offFlags]&flagCompact == 0 {
			t.Fatalf("%+v: not written compact", r)
		}
		if b[0] != 1 || b[1] != byte(Completed) || !bytes.Equal(b[3:19], r.Token[:]) {
			t.Fatalf("compact header %x does not match the layout the scripts read", b[:19])
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", r, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, r)
		}
		for n := range len(b) {
			if _, err := Decode(b[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("compact value cut to %d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
			}
		}
	}
}

// An empty answer's compact value fits jemalloc's 128-byte class, which
// with Redis' per-key cost keeps the record under 250 bytes (measured with
// a real redis-server by `go run ./bench units`); the fixed layout's took
// 236 bytes.
func TestCompactEmptyAnswerSize(t *testing.T) {
	r := compactSample()
	compact := len(r.Encode())
	r.Compact = false
	fixed := len(r.Encode())
	t.Logf("empty answer's value: %d bytes fixed, %d compact", fixed, compact)
	if compact > 124 {
		t.Errorf("compact value of an empty answer is %d bytes, want at most 124", compact)
	}
}

// Only a completed record is compact: an in-progress one keeps the fixed
// header the scripts read its mark from.
func TestCompactOnlyWhenCompleted(t *testing.T) {
	r := &Record{State: InProgress, Created: time.UnixMilli(5), RequestID: "x", Compact: true}
	if b := r.Encode(); b[offFlags]&flagCompact != 0 {
		t.Fatal("an in-progress record was written compact")
	}
	b := compactSample().Encode()
	b[offState] = byte(InProgress)
	if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("compact in-progress value decoded: %v", err)
	}
}
