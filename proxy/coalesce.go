package proxy

import (
	"io"
	"sync"
	"time"
)

// A route's stream_flush_interval: each stream stores (and hands on) at
// most one part per interval. The first event after a quiet interval
// goes at once; those that follow it closely wait for the interval's end
// and go together, in one append and one write. What an event may wait
// is the interval; what it saves is a store round trip and a client
// write per event of a dense stream (tokens, progress lines). Zero, the
// default, stores and sends each read at once, read by the pumping
// goroutine itself (streamPump.pump).
//
// A coalescer reads the upstream on a goroutine of its own, at the
// upstream's pace (up to ahead bytes beyond what was taken), so that
// the pumping goroutine may wait for the interval's end while the events
// that arrive meanwhile are read.
type coalescer struct {
	body  io.Reader
	every time.Duration
	buf   int       // its read buffer's size
	ahead int       // the most it holds read and not taken
	hold  func(int) // counts what it reads in the buffer budget
	free  func(int) // gives back what nobody took

	mu      sync.Mutex
	cond    *sync.Cond // signals pending's growth (to a waiting taker) and room
	pending []byte
	err     error // how the body ended, once read to there
	waiting bool  // a taker waits for pending
	stopped bool
	last    time.Time // when the last part was taken
	exited  chan struct{}
}

func newCoalescer(body io.Reader, every time.Duration, buf, ahead int, hold, free func(int)) *coalescer {
	c := &coalescer{body: body, every: every, buf: buf, ahead: ahead, hold: hold, free: free, exited: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	go c.read()
	return c
}

// read reads the body into pending until it ends or the stream stops.
func (c *coalescer) read() {
	defer close(c.exited)
	c.hold(c.buf)
	defer c.free(c.buf)
	buf := make([]byte, c.buf)
	for {
		n, err := c.body.Read(buf)
		c.mu.Lock()
		for len(c.pending) >= c.ahead && !c.stopped {
			c.cond.Wait()
		}
		if c.stopped { // once the stream ended, what is read is dropped
			c.mu.Unlock()
			return
		}
		c.hold(n)
		c.pending = append(c.pending, buf[:n]...)
		if err != nil {
			c.err = err
		}
		if c.waiting {
			c.cond.Broadcast()
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// next returns what was read since the last part (already counted in the
// budget) and, once read to there, how the body ended. It waits for a
// first byte, then for the interval since the last part to pass; nil,
// nil once stopped.
func (c *coalescer) next() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.pending) == 0 && c.err == nil && !c.stopped {
		c.waiting = true
		c.cond.Wait()
		c.waiting = false
	}
	if wait := time.Until(c.last.Add(c.every)); wait > 0 && c.err == nil && !c.stopped {
		c.mu.Unlock()
		time.Sleep(wait)
		c.mu.Lock()
	}
	if c.stopped {
		return nil, nil
	}
	part, err := c.pending, c.err
	c.pending = nil
	c.last = time.Now()
	c.cond.Broadcast() // room
	return part, err
}

// stop drops what is pending and returns once the reading goroutine is
// gone; the pump closed the body first, which ends a read in progress.
func (c *coalescer) stop() {
	c.mu.Lock()
	c.stopped = true
	c.free(len(c.pending))
	c.pending = nil
	c.cond.Broadcast()
	c.mu.Unlock()
	<-c.exited
}
