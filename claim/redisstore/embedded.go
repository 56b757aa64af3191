package redisstore

import (
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// tick is how often the embedded store's clock advances. Keys expire at
// most this late.
const tick = 50 * time.Millisecond

// Embedded is an in-process Redis (miniredis) for development and the demo.
// It is single-instance and keeps nothing across restarts: never use it in
// production.
type Embedded struct {
	srv  *miniredis.Miniredis
	stop chan struct{}
	done sync.WaitGroup
}

// StartEmbedded starts an embedded store on a loopback port. miniredis does
// not advance time by itself, so a goroutine moves its clock forward with
// the real one; leases and retention then lapse as they would in Redis.
func StartEmbedded() (*Embedded, error) {
	srv := miniredis.NewMiniRedis()
	if err := srv.StartAddr("127.0.0.1:0"); err != nil {
		return nil, err
	}
	e := &Embedded{srv: srv, stop: make(chan struct{})}
	e.done.Add(1)
	go e.advance()
	return e, nil
}

func (e *Embedded) advance() {
	defer e.done.Done()
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.srv.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Addr is the embedded store's host:port.
func (e *Embedded) Addr() string { return e.srv.Addr() }

// Close stops the store and its clock.
func (e *Embedded) Close() {
	close(e.stop)
	e.done.Wait()
	e.srv.Close()
}
