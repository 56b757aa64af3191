package claim

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Clocks, for telling a claim that was never forwarded (mark.go).
//
// A claim's Created time is read on its owner's clock; when its write ran
// is known on the store's clock (the store's time plus what is left of
// the key's lease, less the lease it was given, read in one operation, so
// neither the reader's clock nor how late any reply comes enters it).
// Comparing the two needs a bound on how far the owner's clock is from
// the store's: an owner marks its claims (MarkClaimed, which is what lets
// a later attempt free one) only while it has measured, recently and
// without a step of its own wall clock since, that its clock is within
// MaxClockOffset of every server's. Each measurement is one round trip
// that reads the server's clock: the server read it somewhere between the
// moments the request was sent and answered, so the offset lies in an
// interval as wide as the round trip. A measurement is good when the
// whole interval is within MaxClockOffset, bad when none of it is, and
// tells nothing otherwise (a slow reply): it then neither confirms nor
// withdraws the last good one. Every backend keeps one Clocks.

const (
	// clockValid is how long one good measurement lets claims be
	// marked; the store watcher measures every second.
	clockValid = 10 * time.Second
	// clockStep is how far the wall clock may move against the
	// monotonic one since the last good measurement (a step, e.g. NTP
	// setting the time) before that measurement stops counting.
	clockStep = 20 * time.Millisecond
)

// Clocks is what a store's last clock measurements said. Its zero value
// marks nothing until a good measurement.
type Clocks struct {
	// now, when set, stands in for time.Now (WithClock); measure is the
	// backend's measurement of every server, started in the background
	// when the last good one is getting old.
	now     func() time.Time
	measure func(context.Context)

	// mu guards good and running.
	mu sync.Mutex
	// good is when the last good pass ended, with its monotonic reading;
	// zero when none counts (never measured, or a bad one since).
	good time.Time
	// running is set while a measurement started by a claim is on its
	// way, so that claims start at most one.
	running bool
}

// NewClocks is a backend's Clocks: now is this process' clock (nil:
// time.Now; Options.Now, from WithClock), measure its pass over its
// servers, which calls Note.
func NewClocks(now func() time.Time, measure func(context.Context)) *Clocks {
	return &Clocks{now: now, measure: measure}
}

// Now is this process' clock.
func (c *Clocks) Now() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// Note takes one pass over the servers, which ended at end: good when
// every server answered with a good reading, bad when any answered with a
// bad one.
func (c *Clocks) Note(readings []ClockReading, answered bool, end time.Time) {
	good := answered && len(readings) > 0
	bad := false
	for _, r := range readings {
		good = good && r.Good()
		bad = bad || r.Bad()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case bad:
		c.good = time.Time{}
	case good:
		c.good = end
	}
}

// Distrust withdraws the last good measurement: a claim's own round trip
// found its clock far from the store's (or its write too late), so claims
// are written unmarked until the next good measurement.
func (c *Clocks) Distrust() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.good = time.Time{}
}

// Markable reports whether a claim made at now may be marked: a good
// measurement is recent and the wall clock has not stepped since. When
// the measurement is getting old it starts a new one in the background,
// so that a store used without the watcher (tests, tools) keeps marking.
func (c *Clocks) Markable(now time.Time) bool {
	c.mu.Lock()
	good := c.good
	start := c.measure != nil && !c.running && (good.IsZero() || now.Sub(good) > clockValid/2)
	if start {
		c.running = true
	}
	c.mu.Unlock()
	if start {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			c.measure(ctx)
			c.mu.Lock()
			c.running = false
			c.mu.Unlock()
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

// Confirm decides, from a claim's own round trip (res, the claim sent at
// sent), whether the claim may be forwarded as it is. False: a reader
// could take it for never forwarded (its write ran too late after
// Created on the store's clock, or when it ran is not known), so the
// backend renews it before returning it (MarkRenewed), which no reader
// frees. Such a claim, or a round trip that shows this clock far from the
// store's, withdraws the last measurement: the claims after it are
// written unmarked until the clocks are measured close again.
func (c *Clocks) Confirm(rec *Record, res Result, sent time.Time) bool {
	if !res.ServerNow.IsZero() {
		r := ClockReading{Min: sent.Sub(res.ServerNow), Max: c.Now().Sub(res.ServerNow)}
		if r.Bad() {
			c.Distrust()
		}
	}
	if rec.Forwardable(res.PTTL, res.ServerNow) {
		return true
	}
	c.Distrust()
	return false
}

// Begin readies rec as a claim of lease about to be written: marked
// (MarkClaimed) only while this clock is known to be close to the
// store's (Markable). It returns the time the claim is sent, for
// Confirmed.
func (c *Clocks) Begin(rec *Record, lease time.Duration) (sent time.Time) {
	rec.Mark, rec.Lease = MarkClaimed, lease
	if !c.Markable(c.Now()) {
		rec.Mark = MarkNone
	}
	return c.Now()
}

// Confirmed returns res, the claim of rec just made (sent at sent), once
// it may be forwarded: as it is when Confirm says so; otherwise after
// renew renewed it, marked MarkRenewed, which no reader frees. Both
// backends end their Claim with it.
func (c *Clocks) Confirmed(ctx context.Context, rec *Record, res Result, sent time.Time, renew func(context.Context) error) (Result, error) {
	if c.Confirm(rec, res, sent) {
		return res, nil
	}
	if err := renew(ctx); err != nil {
		return Result{}, fmt.Errorf("claim: %w", err)
	}
	rec.Mark = MarkRenewed
	res.Renewed = true
	return res, nil
}

// LeaseLeft is what is left of rec's lease when its key has ttl left: all
// of it, less the record's tail, and at least 1ms unless orphaned.
func LeaseLeft(rec *Record, ttl time.Duration) time.Duration {
	if rec.Tail > 0 {
		return max(ttl-rec.Tail, 0)
	}
	return max(ttl, time.Millisecond)
}

// Existing is the Result of a claim that found raw, a value stored under
// key, with what was left of the key's lease (ttl) and the store's clock
// (now) read with it (zero when not read). A value that holds this very
// claim (rec's token, in progress: a resent claim whose first send landed)
// is the caller's: Claimed.
func (c *Codec) Existing(key string, rec *Record, raw []byte, ttl time.Duration, now time.Time) (Result, error) {
	found, err := c.Open(key, raw)
	if err != nil {
		return Result{}, err
	}
	if found.Token == rec.Token && found.State == InProgress {
		return Result{Claimed: true, PTTL: ttl, ServerNow: now}, nil
	}
	if found.State != InProgress {
		return Result{Existing: found}, nil
	}
	if ttl > 0 && !now.IsZero() {
		found.Expires, found.ReadAt = now.Add(ttl), now
	}
	return Result{Existing: found, TTL: LeaseLeft(found, ttl), Unforwarded: found.NeverForwarded(ttl, now), ServerNow: now}, nil
}
