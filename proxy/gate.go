package proxy

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// gate is the client's ResponseWriter while the owner forwards. The owner's
// answer goes out through it, from the handler's goroutine; at
// upstream.timeout the late-answer timer may close it from another
// goroutine, answering the client itself, after which everything written
// through it is discarded: the upstream call goes on for its late answer,
// which is stored for the retries, with no client left to write to.
//
// Until the answer starts, headers go into the gate's own map, never into
// the client's, so a close racing the owner's answer never touches a map
// the owner is filling.
type gate struct {
	// committed is set, under mu, once an answer went out through the
	// gate; close reads it first without the lock, which a slow client's
	// write may hold for long.
	committed atomic.Bool

	mu sync.Mutex // guards w, header, status and closed
	w  http.ResponseWriter
	// header collects the owner's headers until the answer starts.
	header http.Header
	// status is the final status written through the gate.
	status int
	// closed is set once close answered the client.
	closed bool
	// sealed is set when the handler is about to return: close may no
	// longer touch the client's writer.
	sealed bool
}

func newGate(w http.ResponseWriter) *gate {
	return &gate{w: w, header: make(http.Header)}
}

// Header returns the owner's header map: the gate's own until the answer
// starts, the client's after it (for trailers).
func (g *gate) Header() http.Header {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.committed.Load() && !g.closed {
		return g.w.Header()
	}
	return g.header
}

// WriteHeader sends the owner's headers and code to the client, unless the
// gate was closed. Informational (1xx) codes pass through and leave the
// answer open.
func (g *gate) WriteHeader(code int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writeHeader(code)
}

func (g *gate) writeHeader(code int) {
	if g.closed {
		return
	}
	if g.committed.Load() {
		g.w.WriteHeader(code) // superfluous: net/http logs it
		return
	}
	h := g.w.Header()
	for k, vs := range g.header {
		h[k] = vs
	}
	g.w.WriteHeader(code)
	if code >= 200 || code == http.StatusSwitchingProtocols {
		g.status = code
		g.committed.Store(true)
		return
	}
	for k := range g.header {
		delete(h, k) // a 1xx's headers are not the final answer's
	}
}

func (g *gate) Write(b []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(b), nil
	}
	if !g.committed.Load() {
		g.writeHeader(http.StatusOK)
	}
	return g.w.Write(b)
}

// FlushError flushes to the client, unless the gate was closed.
func (g *gate) FlushError() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	return http.NewResponseController(g.w).Flush()
}

// SetWriteDeadline sets the client's write deadline, unless the gate was
// closed: a streamed answer's client must take each part within
// client.write_timeout (pump.go). Without it, ResponseController refused
// every deadline, and a stalled client was never cut.
func (g *gate) SetWriteDeadline(t time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.sealed {
		return nil
	}
	return http.NewResponseController(g.w).SetWriteDeadline(t)
}

// errGateClosed is what Hijack returns once the client was answered.
var errGateClosed = errors.New("proxy: the client was already answered")

// Hijack hands the client's connection over (a protocol switch).
func (g *gate) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, nil, errGateClosed
	}
	g.committed.Store(true)
	return http.NewResponseController(g.w).Hijack()
}

// close answers the client with answer and discards everything written
// through the gate afterwards. It reports false, doing nothing, when an
// answer already started.
func (g *gate) close(answer func(http.ResponseWriter)) bool {
	if g.committed.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.committed.Load() || g.closed || g.sealed {
		return false
	}
	g.closed = true
	answer(g.w)
	_ = http.NewResponseController(g.w).Flush()
	return true
}

// seal ends close's access to the client's writer, waiting for a close in
// progress, and returns the status the client got through the gate (0 when
// none) and whether close answered it. The handler seals the gate before it
// returns, since a ResponseWriter must not be used after that.
func (g *gate) seal() (status int, closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sealed = true
	return g.status, g.closed
}
