package proxy

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// budget bounds the bytes this process holds in request and response
// buffers, so that many clients declaring large bodies and trickling them
// cannot run it out of memory (an OOM kill puts every tenant's claims in
// flight into the dual-write window), and one principal's share of it, so
// that one tenant cannot take it all from the others.
type budget struct {
	// limit is the most that may be held; 0 holds without limit.
	limit int64
	// share is the most one principal may hold; 0 holds without limit.
	share int64

	mu   sync.Mutex // guards by
	used atomic.Int64
	// by is what each principal holds now; principals holding nothing
	// are removed.
	by map[string]int64
}

// Errors reading a request body returns when holding more of it would
// exceed the budget, or the principal's share of it.
var (
	errOverBudget = errors.New("proxy: request buffers are at limits.max_buffered_bytes")
	errOverShare  = errors.New("proxy: this principal's request buffers are at its share of limits.max_buffered_bytes")
)

// take reserves n bytes for principal, and reports why not, reserving
// nothing, when that would exceed the limit or the principal's share.
func (b *budget) take(principal string, n int) error {
	if b.limit <= 0 {
		b.used.Add(int64(n))
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.share > 0 && b.by[principal]+int64(n) > b.share {
		return errOverShare
	}
	if b.used.Load()+int64(n) > b.limit {
		return errOverBudget
	}
	b.used.Add(int64(n))
	b.add(principal, int64(n))
	return nil
}

// force reserves n bytes whatever the limit: an upstream's answer must be
// read whole to be stored, since the upstream has already acted.
func (b *budget) force(principal string, n int) {
	b.used.Add(int64(n))
	if b.limit > 0 {
		b.mu.Lock()
		b.add(principal, int64(n))
		b.mu.Unlock()
	}
}

func (b *budget) give(principal string, n int) {
	b.used.Add(-int64(n))
	if b.limit > 0 {
		b.mu.Lock()
		b.add(principal, -int64(n))
		b.mu.Unlock()
	}
}

// add changes principal's holding by n; b.mu must be held.
func (b *budget) add(principal string, n int64) {
	if b.by == nil {
		b.by = map[string]int64{}
	}
	if v := b.by[principal] + n; v > 0 {
		b.by[principal] = v
	} else {
		delete(b.by, principal)
	}
}

// firstChunk is the most a body buffer starts with when its length is
// declared: the rest is held only as it arrives, so a declared length costs
// nothing until the bytes come.
const firstChunk = 64 << 10

// readAll reads r to the end into pooled buffers, growing as bytes arrive
// (from the declared length when it is small, else from firstChunk) and
// never beyond a declared length's own size class. reserve is asked for
// every buffer's capacity before it is used, the old one's given back
// through release; a refusal ends the read with its error. The caller
// releases the returned buffer's capacity and returns it with putBody.
func readAll(r io.Reader, expected int64, reserve func(n int) error, release func(n int)) ([]byte, error) {
	size := 4 << 10
	if expected > 0 {
		size = int(min(expected, firstChunk))
	}
	buf := getBody(size)
	if err := reserve(cap(buf)); err != nil {
		putBody(buf)
		return nil, err
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
			if err := reserve(cap(next)); err != nil {
				putBody(next)
				return buf, err
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
