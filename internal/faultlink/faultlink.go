// Package faultlink is a TCP link for fault tests: it forwards every
// connection made to it to one target, and can delay or hold what it
// carries, in either direction, for the whole link or for single replies.
// It listens on loopback only.
package faultlink

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Link forwards connections to a target. Its zero value is not usable;
// Start one.
type Link struct {
	ln     net.Listener
	target string

	// toServer and toClient are added before every chunk sent that way
	// (nanoseconds): a slow link.
	toServer, toClient atomic.Int64
	// blocked holds every chunk, both ways, while set: a partition.
	blocked atomic.Bool

	// mu guards next, jitter and rng.
	mu sync.Mutex
	// next, when set, delays the next reply chunk it matches.
	next *pendingDelay
	// jitter delays single reply chunks at random.
	jitter replyJitter
	rng    *rand.Rand

	// conns are the open connections, both ends, for Close.
	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

type pendingDelay struct {
	match func([]byte) bool
	delay time.Duration
	done  chan struct{}
}

type replyJitter struct {
	prob     float64
	min, max time.Duration
}

// Start listens on a free loopback port and forwards to target.
func Start(target string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, target: target, conns: map[net.Conn]struct{}{}, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// Addr is the link's host:port: connect here instead of to the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// SetDelay delays every chunk towards the target by toServer and every
// chunk back by toClient; zero ends it.
func (l *Link) SetDelay(toServer, toClient time.Duration) {
	l.toServer.Store(int64(toServer))
	l.toClient.Store(int64(toClient))
}

// Partition holds everything, both ways, while on; what was held is
// delivered once it is off.
func (l *Link) Partition(on bool) { l.blocked.Store(on) }

// DelayNextReply delays the next chunk coming back from the target (on
// any connection) for which match reports true (nil matches any), by d:
// one late reply, as a retransmitted segment or a slow command queued
// ahead of it makes. What follows it on that connection waits behind it,
// as on TCP. The returned channel is closed once that chunk is written to
// the client, which may have read it (and acted on it) before then.
func (l *Link) DelayNextReply(match func([]byte) bool, d time.Duration) <-chan struct{} {
	p := &pendingDelay{match: match, delay: d, done: make(chan struct{})}
	l.mu.Lock()
	l.next = p
	l.mu.Unlock()
	return p.done
}

// SetReplyJitter delays each reply chunk with probability prob by a
// random time in [min, max]; prob 0 ends it.
func (l *Link) SetReplyJitter(prob float64, min, max time.Duration) {
	l.mu.Lock()
	l.jitter = replyJitter{prob: prob, min: min, max: max}
	l.mu.Unlock()
}

// replyDelay is what a reply chunk waits before it is delivered, and the
// channel to close once it is.
func (l *Link) replyDelay(chunk []byte) (time.Duration, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.next; p != nil && (p.match == nil || p.match(chunk)) {
		l.next = nil
		return p.delay, p.done
	}
	j := l.jitter
	if j.prob > 0 && l.rng.Float64() < j.prob {
		return j.min + time.Duration(l.rng.Int64N(int64(j.max-j.min)+1)), nil
	}
	return 0, nil
}

// Close stops the link and cuts every connection through it.
func (l *Link) Close() {
	l.ln.Close()
	l.connMu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.connMu.Unlock()
	l.wg.Wait()
}

func (l *Link) track(c net.Conn, on bool) bool {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	if on {
		if l.conns == nil {
			return false
		}
		l.conns[c] = struct{}{}
	} else {
		delete(l.conns, c)
	}
	return true
}

func (l *Link) serve() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go l.pipe(c)
	}
}

// hold waits while the link is partitioned.
func (l *Link) hold() {
	for l.blocked.Load() {
		time.Sleep(5 * time.Millisecond)
	}
}

func (l *Link) pipe(client net.Conn) {
	defer l.wg.Done()
	defer client.Close()
	server, err := net.DialTimeout("tcp", l.target, time.Second)
	if err != nil {
		return
	}
	defer server.Close()
	l.track(client, true)
	l.track(server, true)
	defer l.track(client, false)
	defer l.track(server, false)
	done := make(chan struct{}, 2)
	go func() {
		copyChunks(server, client, func([]byte) (time.Duration, chan struct{}) { return time.Duration(l.toServer.Load()), nil }, l.hold)
		done <- struct{}{}
	}()
	go func() {
		copyChunks(client, server, func(b []byte) (time.Duration, chan struct{}) {
			d, signal := l.replyDelay(b)
			return d + time.Duration(l.toClient.Load()), signal
		}, l.hold)
		done <- struct{}{}
	}()
	<-done
}

// copyChunks copies from src to dst chunk by chunk, each after the delay
// delay gives it and while hold holds.
func copyChunks(dst, src net.Conn, delay func([]byte) (time.Duration, chan struct{}), hold func()) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			d, signal := delay(buf[:n])
			if d > 0 {
				time.Sleep(d)
			}
			hold()
			_, werr := dst.Write(buf[:n])
			if signal != nil {
				close(signal)
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
