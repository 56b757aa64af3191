package proxy

import (
	"bytes"
	"errors"
	"io"
	"math/bits"
	"sync"
)

// copyBufferSize is the size of the buffers ReverseProxy copies response
// bodies through.
const copyBufferSize = 32 << 10

// bufferPool implements httputil.BufferPool with a sync.Pool, so copying a
// response body does not allocate a fresh 32 KiB buffer per request.
type bufferPool struct{ pool sync.Pool }

func newBufferPool() *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any {
		b := make([]byte, copyBufferSize)
		return &b
	}}}
}

func (p *bufferPool) Get() []byte { return *(p.pool.Get().(*[]byte)) }

func (p *bufferPool) Put(b []byte) {
	if cap(b) == copyBufferSize {
		p.pool.Put(&b)
	}
}

// Body buffers: protected requests' bodies and the upstream's answers are
// read whole, so they come from pools of power-of-two sizes, from 1 KiB
// to 16 MiB. Larger buffers are allocated and left to the GC.
const (
	minBodyClass = 10 // 1 KiB
	maxBodyClass = 24 // 16 MiB
)

var bodyPools [maxBodyClass + 1]sync.Pool

// bodyClass is the smallest class whose buffers hold n bytes.
func bodyClass(n int) int {
	return max(minBodyClass, bits.Len(uint(max(n, 1)-1)))
}

// getBody returns an empty buffer with room for at least n bytes.
func getBody(n int) []byte {
	c := bodyClass(n)
	if c > maxBodyClass {
		return make([]byte, 0, n)
	}
	if p, ok := bodyPools[c].Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, 1<<c)
}

// putBody gives b back for reuse. Nothing may read or write b afterwards.
func putBody(b []byte) {
	c := bits.Len(uint(cap(b))) - 1 // the largest class b holds
	if c < minBodyClass || c > maxBodyClass {
		return
	}
	b = b[:0]
	bodyPools[c].Put(&b)
}

// errBodyReturned is what a lent body reads once its buffer went back to
// the pool.
var errBodyReturned = errors.New("proxy: request finished; its body buffer was reused")

// lentBody reads a pooled buffer until the exchange that owns the buffer
// takes it back. http.Transport may still read a request body after
// RoundTrip returned (when the upstream answers before reading all of it,
// its write loop goes on); once taken back, Read fails instead of reading
// bytes that another request now owns.
type lentBody struct {
	mu       sync.Mutex
	r        bytes.Reader
	returned bool
}

func (b *lentBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.returned {
		return 0, errBodyReturned
	}
	return b.r.Read(p)
}

func (b *lentBody) Close() error { return nil }

// takeBack ends every Read of the buffer; it waits for one in progress.
func (b *lentBody) takeBack() {
	b.mu.Lock()
	b.returned = true
	b.r.Reset(nil)
	b.mu.Unlock()
}

// loans are an exchange's pooled buffers: reqBuf and respBuf, which the
// request's body and the upstream's answer were read into, inflated, a
// stored body inflated for its replay; and lent, the bodies handed out
// over them (the forwarded body, a resend, the answer), more those beyond
// three. giveBack takes all of them back. Only the handler's goroutine
// lends: ReverseProxy calls its hooks and Transport in it.
type loans struct {
	// holder is whom the buffers count against in limits.max_buffered_bytes:
	// the principal, or a webhook delivery's sending peer until its
	// signature verifies (holdAs).
	holder          string
	reqBuf, respBuf []byte
	inflated        []byte
	lent            [3]lentBody
	nlent           int
	more            []*lentBody
}

// giveBack ends every lent body's reads, then returns the buffers to
// their pool, and their bytes to b.
func (l *loans) giveBack(b *budget) {
	for i := range l.nlent {
		l.lent[i].takeBack()
	}
	for _, lb := range l.more {
		lb.takeBack()
	}
	for _, buf := range [...][]byte{l.reqBuf, l.respBuf, l.inflated} {
		if buf != nil {
			b.give(l.holder, cap(buf))
			putBody(buf)
		}
	}
	l.reqBuf, l.respBuf, l.inflated = nil, nil, nil
}

// lend returns a body that reads buf until giveBack.
func (l *loans) lend(buf []byte) *lentBody {
	var b *lentBody
	if l.nlent < len(l.lent) {
		b = &l.lent[l.nlent]
		l.nlent++
	} else {
		b = &lentBody{}
		l.more = append(l.more, b)
	}
	b.r.Reset(buf)
	return b
}

// smallForward is the largest request body forwarded from a copy of its
// own (forwardBody): with the headers it fits the transport's 4 KiB write
// buffer.
const smallForward = 2 << 10

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
