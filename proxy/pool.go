package proxy

import "sync"

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
