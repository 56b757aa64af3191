package claim

import (
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Compressed bodies. Redis memory is what a deployment pays for, and the
// answers of legacy POST endpoints are mostly JSON, which zstd shrinks
// three times or more. A completed record's body above a threshold is
// stored compressed, flagged, when the store writes store.record_format 3
// with store.compression: zstd (releases before v0.5.0 refuse the flag, so
// it is written only once every replica reads it). Readers accept both. An
// answer that carries a Content-Encoding is already compressed and stored
// as it is, and so is one that does not shrink.

// flagCompressed marks a completed record whose body is zstd-compressed.
const flagCompressed = 32

// CompressThreshold is the smallest body compressed: below it the frame's
// overhead eats the saving.
const CompressThreshold = 256

// maxInflated bounds a decompressed body: a record is never larger than
// the largest max_response_body a route may set, and a hostile record in
// Redis must not make a reader allocate without limit.
const maxInflated = 64 << 20

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
)

func zstdCodecs() (*zstd.Encoder, *zstd.Decoder) {
	zstdOnce.Do(func() {
		zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true))
		zstdDec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxInflated), zstd.WithDecoderMaxWindow(maxInflated))
	})
	return zstdEnc, zstdDec
}

// WithCompression compresses completed records' bodies (zstd) from
// CompressThreshold bytes on. Records written so are read only by v0.5.0
// and later: give it once every replica runs one (store.record_format 3).
func WithCompression() Option {
	return func(s *Store) { s.compress = true }
}

// compressedBody is rec's body compressed, when this store compresses
// and it pays; ok is false otherwise.
func (s *Store) compressedBody(rec *Record) (body []byte, ok bool) {
	if !s.compress || rec.State != Completed || rec.BodyCompressed || len(rec.Body) < CompressThreshold || rec.Header.Get("Content-Encoding") != "" {
		return nil, false
	}
	enc, _ := zstdCodecs()
	z := enc.EncodeAll(rec.Body, make([]byte, 0, len(rec.Body)/2))
	if len(z) >= len(rec.Body) {
		return nil, false
	}
	return z, true
}

// inflate decompresses rec's body in place when it is stored compressed.
func inflate(rec *Record) error {
	if !rec.BodyCompressed {
		return nil
	}
	_, dec := zstdCodecs()
	b, err := dec.DecodeAll(rec.Body, nil)
	if err != nil || len(b) > maxInflated {
		return &RecordError{ReasonCorrupt}
	}
	rec.Body, rec.BodyCompressed = b, false
	return nil
}

// open reads a value stored under key: opened when sealed, its body
// decompressed when compressed.
func (s *Store) open(key string, raw []byte) (*Record, error) {
	rec, err := s.seal.open(key, raw)
	if err != nil {
		return nil, err
	}
	if err := inflate(rec); err != nil {
		return nil, err
	}
	return rec, nil
}
