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
