package claim

import (
	"fmt"
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

// compressThreshold is the smallest body compressed: below it the frame's
// overhead eats the saving.
const compressThreshold = 256

// Reading. A record planted in Redis can carry a zstd bomb (1,945 stored
// bytes inflate to 60 MiB), so a body is never inflated on read: a Store
// returns it as stored, flagged, and whoever answers with it inflates it
// into a buffer of the length its frame declares (InflatedLen; every
// writer declares it), which the proxy holds in its buffer budget and
// bounds by the route's max_response_body. The decoder never writes
// beyond that buffer's capacity, so a frame that inflates to more than it
// declared, or a second frame, is refused, not followed.

// maxInflated bounds any decompressed body: no route may set a larger
// max_response_body.
const maxInflated = 64 << 20

// maxWindow is the largest zstd window a stored frame may declare: the
// writer's (SpeedDefault) is 8 MiB at most.
const maxWindow = 8 << 20

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
)

func zstdCodecs() (*zstd.Encoder, *zstd.Decoder) {
	zstdOnce.Do(func() {
		zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1), zstd.WithZeroFrames(true))
		zstdDec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(maxInflated), zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecodeAllCapLimit(true))
	})
	return zstdEnc, zstdDec
}

// WithCompression compresses completed records' bodies (zstd) from
// compressThreshold bytes on. Records written so are read only by v0.5.0
// and later: give it once every replica runs one (store.record_format 3).
func WithCompression() Option {
	return func(o *Options) { o.codec.compress = true }
}

// compressedBody is rec's body compressed, when this store compresses
// and it pays; ok is false otherwise.
func (c *Codec) compressedBody(rec *Record) (body []byte, ok bool) {
	if !c.compress || rec.State != Completed || rec.BodyCompressed || len(rec.Body) < compressThreshold || rec.Header.Get("Content-Encoding") != "" {
		return nil, false
	}
	enc, _ := zstdCodecs()
	z := enc.EncodeAll(rec.Body, make([]byte, 0, len(rec.Body)/2))
	if len(z) >= len(rec.Body) {
		return nil, false
	}
	return z, true
}

// InflatedLen is the length of rec's body as answered: for a compressed
// body the content size its zstd frame declares, else the body's own. A
// compressed body that declares none, or more than maxInflated, is
// unreadable (ErrCorrupt).
func (rec *Record) InflatedLen() (int, error) {
	if !rec.BodyCompressed {
		return len(rec.Body), nil
	}
	var h zstd.Header
	if err := h.Decode(rec.Body); err != nil || !h.HasFCS || h.Skippable || h.FrameContentSize > maxInflated {
		return 0, &RecordError{ReasonCorrupt}
	}
	return int(h.FrameContentSize), nil
}

// Inflate decompresses rec's compressed body into dst[:0], in place: dst
// must have room for InflatedLen bytes, and nothing is written beyond its
// capacity. A body that inflates to another length than its frame
// declares is unreadable (ErrCorrupt), and rec is left as it was. A body
// not compressed is left as it is.
func (rec *Record) Inflate(dst []byte) error {
	if !rec.BodyCompressed {
		return nil
	}
	n, err := rec.InflatedLen()
	if err != nil {
		return err
	}
	if cap(dst) < n {
		return fmt.Errorf("claim: inflating a %d-byte body into %d bytes of room", n, cap(dst))
	}
	_, dec := zstdCodecs()
	b, err := dec.DecodeAll(rec.Body, dst[:0:n])
	if err != nil || len(b) != n {
		return &RecordError{ReasonCorrupt}
	}
	rec.Body, rec.BodyCompressed = b, false
	return nil
}
