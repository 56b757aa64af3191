package claim

import (
	"bytes"
	"fmt"
	"testing"
	"time"
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
		s := &Store{compress: compress}
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
				if err := inflate(r); err != nil {
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
	if err := inflate(r); err == nil {
		t.Fatal("garbage decompressed")
	}
}
