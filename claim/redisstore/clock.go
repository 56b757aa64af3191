package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Clocks: this process' clock measured against every master's with TIME
// (claim.Clocks says what the measurements are for).

// readClock measures one master's clock with TIME.
func readClock(ctx context.Context, c redis.Cmdable, now func() time.Time) (claim.ClockReading, error) {
	sent := now()
	t, err := c.Time(ctx).Result()
	answered := now()
	if err != nil {
		return claim.ClockReading{}, err
	}
	// The process' clock read sent before Redis read t, and answered
	// after it.
	return claim.ClockReading{Min: sent.Sub(t.Round(0)), Max: answered.Sub(t.Round(0))}, nil
}

// CheckClocks measures this process' clock against every master's, as the
// store watcher does every second (Health): claims are marked only while
// a recent measurement was good (see MaxClockOffset).
func (s *Store) CheckClocks(ctx context.Context) {
	var (
		mu       sync.Mutex
		readings []claim.ClockReading
		answered = true
	)
	read := func(ctx context.Context, _ string, c redis.Cmdable) {
		r, err := readClock(ctx, c, s.clocks.Now)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			answered = false
			return
		}
		readings = append(readings, r)
	}
	if err := s.eachMaster(ctx, read); err != nil {
		answered = false
	}
	s.clocks.Note(readings, answered, s.clocks.Now())
}
