package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Clocks, for telling a claim that was never forwarded (mark.go).
//
// A claim's Created time is read on its owner's clock; when its SET ran is
// known on Redis' clock (TIME + PTTL - the PX it was given, both read in
// one script, so neither the reader's clock nor how late any reply comes
// enters it). Comparing the two needs a bound on how far the owner's clock
// is from Redis': an owner marks its claims (MarkClaimed, which is what
// lets a later attempt free one) only while it has measured, recently and
// without a step of its own wall clock since, that its clock is within
// MaxClockOffset of every master's. Each measurement is one TIME round
// trip: Redis read its clock somewhere between the moments the command
// was sent and answered, so the offset lies in an interval as wide as the
// round trip. A measurement is good when the whole interval is within
// MaxClockOffset, bad when none of it is, and tells nothing otherwise (a
// slow reply): it then neither confirms nor withdraws the last good one.

const (
	// clockValid is how long one good measurement lets claims be
	// marked; the store watcher measures every second.
	clockValid = 10 * time.Second
	// clockStep is how far the wall clock may move against the
	// monotonic one since the last good measurement (a step, e.g. NTP
	// setting the time) before that measurement stops counting.
	clockStep = 20 * time.Millisecond
)

// clockState is what the last measurements said. Its zero value marks
// nothing until a good measurement.
type clockState struct {
	// mu guards good and bad.
	mu sync.Mutex
	// good is when the last good pass ended, with its monotonic reading;
	// zero when none counts (never measured, or a bad one since).
	good time.Time
	// running is set while a measurement started by a claim is on its
	// way, so that claims start at most one.
	running bool
}

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

// noteClocks takes one pass over the masters: good when every master
// answered with a good reading, bad when any answered with a bad one.
func (s *Store) noteClocks(readings []claim.ClockReading, answered bool, end time.Time) {
	good := answered && len(readings) > 0
	bad := false
	for _, r := range readings {
		good = good && r.Good()
		bad = bad || r.Bad()
	}
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	switch {
	case bad:
		s.clock.good = time.Time{}
	case good:
		s.clock.good = end
	}
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
		r, err := readClock(ctx, c, s.now)
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
	s.noteClocks(readings, answered, s.now())
}

// distrustClocks withdraws the last good measurement: a claim's own
// round trip found its clock far from Redis' (or its SET too late), so
// claims are written unmarked until the next good measurement.
func (s *Store) distrustClocks() {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	s.clock.good = time.Time{}
}

// markable reports whether a claim made at now may be marked: a good
// measurement is recent and the wall clock has not stepped since. When
// the measurement is getting old it starts a new one in the background,
// so that a store used without the watcher (tests, tools) keeps marking.
func (s *Store) markable(now time.Time) bool {
	s.clock.mu.Lock()
	good := s.clock.good
	start := !s.clock.running && (good.IsZero() || now.Sub(good) > clockValid/2)
	if start {
		s.clock.running = true
	}
	s.clock.mu.Unlock()
	if start {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			s.CheckClocks(ctx)
			s.clock.mu.Lock()
			s.clock.running = false
			s.clock.mu.Unlock()
		}()
	}
	if good.IsZero() {
		return false
	}
	mono := now.Sub(good) // monotonic: both readings carry it
	wall := time.Duration(now.UnixNano() - good.UnixNano())
	step := wall - mono
	return mono >= 0 && mono <= clockValid && -clockStep <= step && step <= clockStep
}

// now is the process' clock.
func (s *Store) now() time.Time {
	if s.clockNow != nil {
		return s.clockNow()
	}
	return time.Now()
}
