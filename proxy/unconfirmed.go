package proxy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Claims whose reply never came. When a claim's SET may have been written
// and no answer came in time (Redis stalled, a partition, a reset), the
// client is told nothing was forwarded, and Redis may still run the SET
// later, leaving a claim nobody owns. The sidecar remembers its token and,
// in the background, deletes that claim, fenced on the token, until Redis
// answers: once it says the claim is gone (released) or was never there
// (not_found: checked again a while later, for a SET still in flight), or
// until the claim would have lapsed by itself (gave_up). A claim that
// lands after that is still recognised by the next attempt as never
// forwarded (claim.Result.Unforwarded) and freed then (cleared_on_retry).

// Bounds and waits of the cleanup.
const (
	maxUnconfirmed       = 10000                  // pending cleanups held at once
	unconfirmedRecheck   = 2 * time.Second        // how long after "not there" it is looked for again
	unconfirmedFirstWait = 100 * time.Millisecond // after a failed try; the first is at once
	unconfirmedMaxWait   = time.Second            // the claim's lease may be short: keep trying often
	unconfirmedOpTimeout = time.Second
	// unconfirmedSendingWait bounds how long a claim whose commands may
	// still be sent (claim.StillSending) is looked for every
	// unconfirmedSendingPoll.
	unconfirmedSendingWait = 10 * time.Second
	unconfirmedSendingPoll = 50 * time.Millisecond
	// unconfirmedParallel bounds the cleanups tried at once.
	unconfirmedParallel = 32
)

// pendingClaim is one claim to clean up.
type pendingClaim struct {
	key, route string
	token      claim.Token
	// until is when the claim would lapse by itself: lease + tail after
	// it was sent.
	until time.Time
	// next is when to try again; absentSince, when set, is when Redis
	// first said the claim was not there.
	next, absentSince time.Time
	wait              time.Duration
	// sending, when not nil, receives once the claim's commands can no
	// longer be sent (claim.StillSending): until then "not there" means
	// "not yet", and the claim is looked for often.
	sending <-chan struct{}
	// sendingUntil bounds the wait for sending.
	sendingUntil time.Time
}

// unconfirmed holds the pending cleanups of one Handler. Its worker runs
// only while some are pending.
type unconfirmed struct {
	store   claim.Store
	metrics *Metrics
	log     *slog.Logger
	// mu guards pending and running.
	mu      sync.Mutex
	pending []*pendingClaim
	running bool
	// kick wakes the worker when a cleanup is added, so that the first
	// try is at once, not after the worker's sleep.
	kick chan struct{}
	// now is the clock; tests may set it.
	now func() time.Time
}

// add remembers a claim whose reply never came; sending is
// claim.StillSending of its error.
func (u *unconfirmed) add(route, key string, token claim.Token, until time.Time, sending <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.pending) >= maxUnconfirmed {
		u.metrics.unconfirmed.WithLabelValues(unconfirmedGaveUp).Inc()
		u.log.Error("unconfirmed claim not cleaned up: too many pending; a retry frees it once it is seen never forwarded, or it lapses", "route", route, "key", key)
		return
	}
	now := u.now()
	u.pending = append(u.pending, &pendingClaim{key: key, route: route, token: token, until: until, next: now, wait: unconfirmedFirstWait,
		sending: sending, sendingUntil: now.Add(unconfirmedSendingWait)})
	if u.kick == nil {
		u.kick = make(chan struct{}, 1)
	}
	if !u.running {
		u.running = true
		go u.run()
		return
	}
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// releaseFailed hands the cleanup a claim whose owner knows nothing
// executed (nothing was forwarded, or the upstream said so) and whose
// release failed with err: deleted, fenced on its token, once the store
// answers, so that no retry takes it, after its lease, for an orphan to
// answer outcome-unknown. claimedAt is when it was sent.
func (u *unconfirmed) releaseFailed(route, key string, rec *claim.Record, claimedAt time.Time, lease time.Duration, err error) {
	if err == nil || errors.Is(err, claim.ErrLeaseLost) {
		return
	}
	u.add(route, key, rec.Token, claimedAt.Add(lease+rec.Tail), claim.StillSending(err))
}

// count is how many cleanups are pending.
func (u *unconfirmed) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.pending)
}

// run works through the pending cleanups until none is left.
func (u *unconfirmed) run() {
	for {
		u.mu.Lock()
		if len(u.pending) == 0 {
			u.running = false
			u.mu.Unlock()
			return
		}
		due := u.pending[0].next
		for _, p := range u.pending {
			if p.next.Before(due) {
				due = p.next
			}
		}
		kick := u.kick
		u.mu.Unlock()
		if d := due.Sub(u.now()); d > 0 {
			t := time.NewTimer(min(d, unconfirmedMaxWait))
			select {
			case <-t.C:
			case <-kick: // a new cleanup: its first try is now
			}
			t.Stop()
		}
		u.pass()
	}
}

// pass tries every cleanup that is due, once.
func (u *unconfirmed) pass() {
	u.mu.Lock()
	var due []*pendingClaim
	now := u.now()
	for _, p := range u.pending {
		if !p.next.After(now) {
			due = append(due, p)
		}
	}
	u.mu.Unlock()
	// At once, not one after the other: a try whose reply comes late (the
	// very fault that made these claims) must not hold up the others
	// while their leases run out.
	var wg sync.WaitGroup
	sem := make(chan struct{}, unconfirmedParallel)
	for _, p := range due {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if result, done := u.try(p); done {
				u.finish(p, result)
			}
		})
	}
	wg.Wait()
}

// try asks Redis to delete p's claim; done when p needs nothing more.
func (u *unconfirmed) try(p *pendingClaim) (result string, done bool) {
	now := u.now()
	if now.After(p.until) {
		return unconfirmedGaveUp, true
	}
	// While the claim's commands may still be on their way (a pipeline
	// waiting on late replies), it is deleted as soon as it is there:
	// looked for often, not after a wait, because every moment it stays is
	// one in which a retry elsewhere may find its lease over. (go-redis
	// never sends a claim twice: claim.noRetry.)
	stillSending := false
	if p.sending != nil {
		select {
		case <-p.sending:
			p.sending = nil
		default:
			if stillSending = now.Before(p.sendingUntil); !stillSending {
				p.sending = nil // the client's timeouts end every send long before this
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), unconfirmedOpTimeout)
	defer cancel()
	found, err := u.store.ReleaseUnconfirmed(ctx, p.key, p.token)
	switch {
	case err != nil:
		p.next, p.wait = now.Add(p.wait), min(2*p.wait, unconfirmedMaxWait)
		return "", false
	case found:
		return unconfirmedReleased, true
	case stillSending:
		p.next = now.Add(unconfirmedSendingPoll) // not there yet: look again soon
		return "", false
	case p.absentSince.IsZero():
		// Not there yet: a SET written before Redis stalled may still be
		// in a socket buffer. Look again once everything sent before has
		// surely been read.
		p.absentSince, p.next = now, now.Add(unconfirmedRecheck)
		return "", false
	default:
		return unconfirmedNotFound, true
	}
}

// finish counts and logs p's result and forgets it.
func (u *unconfirmed) finish(p *pendingClaim, result string) {
	u.metrics.unconfirmed.WithLabelValues(result).Inc()
	level := u.log.Info
	if result == unconfirmedGaveUp {
		level = u.log.Warn
	}
	level("unconfirmed claim", "route", p.route, "key", p.key, "result", result)
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, q := range u.pending {
		if q == p {
			u.pending = append(u.pending[:i], u.pending[i+1:]...)
			return
		}
	}
}

// mayHaveWritten reports whether a failed claim's SET may have reached
// Redis: anything but a refusal decided before sending (store full, the
// quota), a record that could not be read, or a connection that could not
// be had (refused, no route, the pool's wait ran out): with nothing
// written there is nothing to clean up. go-redis may have written an
// earlier attempt on a connection that broke before the dial that failed;
// such a claim, if it landed, is found by the next attempt like any other
// (freed as never forwarded when it landed late, else held as an orphan):
// an outcome-unknown at worst, never a second execution.
func mayHaveWritten(err error) bool {
	if !errors.Is(err, claim.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return false
	}
	return !errors.Is(err, claim.ErrNotSent)
}
