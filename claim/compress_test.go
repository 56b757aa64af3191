package claim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// payment3KB is about 3 KB of a legacy API's JSON answer.
func payment3KB() []byte {
	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[`)
	for i := 0; b.Len() < 3000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"pi_%024x","object":"payment_intent","amount":%d,"currency":"eur","status":"succeeded","created":%d,"metadata":{"order_id":"%d"}}`, i*7919, 1000+i, 1764566400+i, 10000+i)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// BenchmarkCompressedRecord is what compression adds to a first attempt
// (encode: compress the body) and to a replay (decode: decompress it),
// for a 3 KB JSON answer, beside the same record uncompressed.
func BenchmarkCompressedRecord(b *testing.B) {
	body := payment3KB()
	rec := &Record{State: Completed, Created: time.Now(), Completed: time.Now(), Status: 201, RequestID: "0123456789abcdef0123456789abcdef", Body: body}
	for _, compress := range []bool{false, true} {
		s := &Codec{compress: compress}
		b.Run(fmt.Sprintf("encode/compress=%t", compress), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				_ = s.stored(rec).Encode()
			}
		})
		raw := s.stored(rec).Encode()
		b.Run(fmt.Sprintf("decode/compress=%t", compress), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				r, err := decode(raw)
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Inflate(make([]byte, 0, len(body))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestInflateRefusesGarbage: a record flagged compressed whose body is
// not a zstd frame is unreadable, never a panic or an unbounded read.
func TestInflateRefusesGarbage(t *testing.T) {
	r := &Record{State: Completed, Status: 200, Body: []byte("not zstd at all"), BodyCompressed: true}
	if _, err := r.InflatedLen(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("garbage declares a length: %v", err)
	}
	if err := r.Inflate(make([]byte, 0, 1<<20)); err == nil {
		t.Fatal("garbage decompressed")
	}
}

// TestInflateIsBoundedByTheDeclaredLength (issue 41, item 5): a planted
// body is inflated only into the room its frame declares. A frame that
// lies about its content size, a second frame after the first, or a frame
// without a declared size is refused, never followed: nothing is written
// beyond the declared length.
func TestInflateIsBoundedByTheDeclaredLength(t *testing.T) {
	enc, _ := zstdCodecs()
	big := bytes.Repeat([]byte("A"), 4<<20)
	small := bytes.Repeat([]byte("b"), 1000)
	one := enc.EncodeAll(small, nil)
	bomb := enc.EncodeAll(big, nil)
	// The declared size patched down: the frame header's last bytes are
	// its content size (4 bytes here, for 4 MiB).
	lying := bytes.Clone(bomb)
	var h zstd.Header
	if err := h.Decode(lying); err != nil || h.FrameContentSize != uint64(len(big)) {
		t.Fatalf("header: %v %+v", err, h)
	}
	binary.LittleEndian.PutUint32(lying[h.HeaderSize-4:], 1000)
	huge := bytes.Clone(bomb)
	binary.LittleEndian.PutUint32(huge[h.HeaderSize-4:], 1<<31)
	for _, tc := range []struct {
		name string
		body []byte
		ok   bool
	}{
		{"one frame", one, true},
		{"a frame declaring 1,000 bytes that inflates to 4 MiB", lying, false},
		{"a second frame after the first", append(bytes.Clone(one), bomb...), false},
		{"a frame declaring 2 GiB", huge, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Record{State: Completed, Status: 200, Body: tc.body, BodyCompressed: true}
			n, err := r.InflatedLen()
			if err == nil {
				if n != len(small) {
					t.Fatalf("declared %d, want %d", n, len(small))
				}
				dst := make([]byte, 0, n)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				err = r.Inflate(dst)
				runtime.ReadMemStats(&after)
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
					t.Errorf("inflating allocated %d bytes for a body declaring %d", grew, n)
				}
				if r.BodyCompressed == (err == nil) || cap(r.Body) > n {
					t.Errorf("inflated into %d bytes of room (%d declared), compressed %t, err %v", cap(r.Body), n, r.BodyCompressed, err)
				}
			}
			if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err %v, want ok %t (ErrCorrupt otherwise)", err, tc.ok)
			}
			if tc.ok && !bytes.Equal(r.Body, small) {
				t.Errorf("inflated %d bytes, want the 1,000 written", len(r.Body))
			}
		})
	}
}
