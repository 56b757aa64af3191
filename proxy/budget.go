package proxy

import (
	"errors"
	"io"
	"sync/atomic"
)

// budget bounds the bytes this process holds in request and response
// buffers, so that many clients declaring large bodies and trickling them
// cannot run it out of memory: an OOM kill puts every tenant's claims in
// flight into the dual-write window.
type budget struct {
	// limit is the most that may be held; 0 holds without limit.
	limit int64
	used  atomic.Int64
}

// errOverBudget is what reading a request body returns when holding more
// of it would exceed the budget.
var errOverBudget = errors.New("proxy: request buffers are at limits.max_buffered_bytes")

// take reserves n bytes, and reports false, reserving nothing, when that
// would exceed the limit.
func (b *budget) take(n int) bool {
	if b.limit <= 0 {
		b.used.Add(int64(n))
		return true
	}
	for {
		used := b.used.Load()
		if used+int64(n) > b.limit {
			return false
		}
		if b.used.CompareAndSwap(used, used+int64(n)) {
			return true
		}
	}
}

// force reserves n bytes whatever the limit: an upstream's answer must be
// read whole to be stored, since the upstream has already acted.
func (b *budget) force(n int) { b.used.Add(int64(n)) }

func (b *budget) give(n int) { b.used.Add(-int64(n)) }

// firstChunk is the most a body buffer starts with when its length is
// declared: the rest is held only as it arrives, so a declared length costs
// nothing until the bytes come.
const firstChunk = 64 << 10

// readAll reads r to the end into pooled buffers, growing as bytes arrive
// (from the declared length when it is small, else from firstChunk) and
// never beyond a declared length's own size class. reserve is asked for
// every buffer's capacity before it is used, the old one's given back
// through release; a refusal ends the read with errOverBudget. The caller
// releases the returned buffer's capacity and returns it with putBody.
func readAll(r io.Reader, expected int64, reserve func(n int) bool, release func(n int)) ([]byte, error) {
	size := 4 << 10
	if expected > 0 {
		size = int(min(expected, firstChunk))
	}
	buf := getBody(size)
	if !reserve(cap(buf)) {
		putBody(buf)
		return nil, errOverBudget
	}
	for {
		if len(buf) == cap(buf) {
			// Full: see whether the body ends here before growing, so a
			// body of exactly its declared length costs no larger class.
			var probe [1]byte
			n, err := io.ReadFull(r, probe[:])
			if n == 0 {
				if err == io.EOF || err == io.ErrUnexpectedEOF {
					return buf, nil
				}
				return buf, err
			}
			size := 2 * cap(buf)
			if expected > int64(cap(buf)) && int64(size) > expected {
				size = int(expected) // the declared length's class, not the next
			}
			next := getBody(size)
			if !reserve(cap(next)) {
				putBody(next)
				return buf, errOverBudget
			}
			next = append(append(next, buf...), probe[0])
			release(cap(buf))
			putBody(buf)
			buf = next
			continue
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
