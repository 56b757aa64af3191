package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Claim takes key for rec's owner with a lease, or returns the record that
// already holds it, in one round trip. rec must be InProgress. With a
// non-zero q, a claim that takes a new key counts against the principal's
// quota, and one beyond it is undone and returns a QuotaError; a zero
// Quota counts nothing.
//
// The round trip is one script (claimScript) that also reads the key's
// PTTL and Redis' clock, so whether the claim may be forwarded is decided
// from what this round trip measured, never from an earlier measurement
// (mark.go): a claim its SET made look never forwarded is renewed before
// it is returned, and one that was freed meanwhile is ErrLeaseLost (the
// caller claims again, with a new token). With a quota the count (INCR,
// PEXPIRE NX) rides in the same pipeline.
func (s *Store) Claim(ctx context.Context, key string, rec *claim.Record, lease time.Duration, q claim.Quota) (claim.Result, error) {
	sent := s.clocks.Begin(rec, lease)
	before := s.sendState()
	res, err := s.claimAny(ctx, key, rec, lease, q)
	if err != nil && errors.Is(err, claim.ErrUnavailable) {
		err = s.notSent(before, err)
	}
	if err != nil || !res.Claimed {
		return res, err
	}
	return s.clocks.Confirmed(ctx, rec, res, sent, func(ctx context.Context) error { return s.Renew(ctx, key, rec, lease) })
}

// PlantUnconfirmed writes rec's claim as one whose reply never reached its
// owner leaves it (marked, never confirmed, never renewed): what a claim
// written during a Redis stall becomes. For tests and the chaos harness;
// the proxy never calls it.
func (s *Store) PlantUnconfirmed(ctx context.Context, key string, rec *claim.Record, lease time.Duration) error {
	rec.Mark, rec.Lease = claim.MarkClaimed, lease
	res, err := s.claim(ctx, key, rec, lease)
	if err == nil && !res.Claimed {
		err = fmt.Errorf("plant: the key is taken: %w", claim.ErrLeaseLost)
	}
	return err
}

// claimAny is Claim on whichever path fits.
func (s *Store) claimAny(ctx context.Context, key string, rec *claim.Record, lease time.Duration, q claim.Quota) (claim.Result, error) {
	if s.full.Load() {
		return s.claimWhenFull(ctx, key, rec, lease+rec.Tail)
	}
	if q.Limit > 0 && s.waitReplicas == 0 {
		res, err := s.claimCounted(ctx, key, rec, lease, q)
		if !errors.Is(err, errNoScript) {
			return res, err
		}
	}
	res, err := s.claim(ctx, key, rec, lease)
	if q.Limit <= 0 || err != nil || !res.Claimed {
		return res, err
	}
	// WAIT: the count cannot ride in the claim's pipeline.
	pipe := s.client.Pipeline()
	incr := pipe.Incr(ctx, q.Key)
	expire := pipe.Do(ctx, "PEXPIRE", q.Key, q.Window.Milliseconds(), "NX")
	_, _ = pipe.Exec(ctx)
	s.windowFallback(ctx, q, incr, expire)
	return s.overQuota(ctx, key, rec, q, res, incr)
}

// errNoScript: Redis did not have the claim script cached; it is loaded
// now, and the claim is to be sent again.
var errNoScript = errors.New("claim: script not loaded")

// claim is Claim counting nothing.
func (s *Store) claim(ctx context.Context, key string, rec *claim.Record, lease time.Duration) (claim.Result, error) {
	value := s.codec.Encode(key, rec)
	lease += rec.Tail // the record outlives its lease by its tail
	for attempt := 0; ; attempt++ {
		run := claimCmd(ctx, key, value, lease, s.streamLimit)
		cmds, epoch, master := s.withEpochRead(ctx, key, rec, noRetry{run})
		wait, err := s.write(ctx, key, len(value), cmds...)
		if err != nil {
			return claim.Result{}, s.unavailable("claim", err)
		}
		s.noteEpochRead(master, epoch)
		if err := run.Err(); attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := claimScript.Load(ctx, s.client).Err(); err != nil {
				return claim.Result{}, s.unavailable("claim", err)
			}
			continue
		}
		res, err := s.claimReply(key, rec, run)
		if err == nil && res.Claimed {
			s.checkWait("claim", wait)
		}
		return res, err
	}
}

// claimCmd is the claim: claimScript by its SHA; a streamed record
// longer than limit (0: any) is not read back.
func claimCmd(ctx context.Context, key string, value []byte, ttl time.Duration, limit int) *redis.Cmd {
	return redis.NewCmd(ctx, "evalsha", claimScript.Hash(), 1, key, value, ttl.Milliseconds(), limit)
}

// claimReply interprets claimScript's reply.
func (s *Store) claimReply(key string, rec *claim.Record, run *redis.Cmd) (claim.Result, error) {
	v, err := run.Slice()
	if err != nil {
		return claim.Result{}, s.unavailable("claim", err)
	}
	if len(v) == 1 { // a settled record: no lease to read
		raw, _ := v[0].(string)
		return s.existing(key, rec, raw, 0, time.Time{})
	}
	if len(v) == 2 { // a streamed record longer than any route stores
		return claim.Result{}, fmt.Errorf("claim: a streamed record of %v bytes, over the %d read back: %w", v[1], s.streamLimit, &claim.RecordError{Reason: claim.ReasonTooLarge})
	}
	if len(v) != 4 {
		return claim.Result{}, fmt.Errorf("claim: unexpected reply %v: %w", v, claim.ErrUnavailable)
	}
	ttl, now, _ := ttlReply(v[1:])
	if n, ok := v[0].(int64); ok && n == 1 {
		return claim.Result{Claimed: true, PTTL: ttl, ServerNow: now}, nil
	}
	raw, _ := v[0].(string)
	return s.existing(key, rec, raw, ttl, now)
}

// found interprets the value read under key without the claim script
// (a store too full for new claims reads it with GET); for a record in
// progress it asks the key's PTTL and Redis' clock in one script, for
// Retry-After, to tell an orphaned record and to tell a claim that was
// never forwarded. When that fails, the whole lease is an upper bound.
func (s *Store) found(ctx context.Context, key string, rec *claim.Record, raw string, lease time.Duration) (claim.Result, error) {
	res, err := s.existing(key, rec, raw, 0, time.Time{})
	if err != nil || res.Claimed || res.Existing.State != claim.InProgress {
		return res, err
	}
	ttl := lease
	if v, err := s.eval(ctx, ttlScript, key, 0).Slice(); err == nil {
		if pttl, now, ok := ttlReply(v); ok {
			ttl = pttl
			res.Unforwarded = res.Existing.NeverForwarded(pttl, now)
			if pttl > 0 {
				res.Existing.Expires, res.Existing.ReadAt, res.ServerNow = now.Add(pttl), now, now
			}
		}
	}
	res.TTL = claim.LeaseLeft(res.Existing, max(ttl, time.Millisecond))
	return res, nil
}

// ttlReply reads {pttl, seconds, microseconds}, the end of ttlScript's
// and claimScript's replies.
func ttlReply(v []any) (pttl time.Duration, now time.Time, ok bool) {
	if len(v) != 3 {
		return 0, time.Time{}, false
	}
	ms, ok1 := v[0].(int64)
	sec, err1 := replyInt(v[1])
	usec, err2 := replyInt(v[2])
	if !ok1 || err1 != nil || err2 != nil {
		return 0, time.Time{}, false
	}
	return time.Duration(ms) * time.Millisecond, time.Unix(sec, usec*1000), true
}

// replyInt reads an integer a script returned, as a number or as TIME's
// strings.
func replyInt(v any) (int64, error) {
	switch n := v.(type) {
	case int64:
		return n, nil
	case string:
		return strconv.ParseInt(n, 10, 64)
	}
	return strconv.ParseInt(fmt.Sprint(v), 10, 64)
}

// existing interprets the value a claim found under its key, with the
// key's PTTL and Redis' clock read with it (zero when not read).
func (s *Store) existing(key string, rec *claim.Record, raw string, ttl time.Duration, now time.Time) (claim.Result, error) {
	return s.codec.Existing(key, rec, []byte(raw), ttl, now)
}

// Get returns the record under key, or nil when there is none, and for an
// in-progress record what is left of its lease (see Result.TTL).
func (s *Store) Get(ctx context.Context, key string) (*claim.Record, time.Duration, error) {
	get := redis.NewStringCmd(ctx, "get", key)
	pttl := redis.NewDurationCmd(ctx, time.Millisecond, "pttl", key)
	if err := s.exec(ctx, 0, get, pttl); err != nil {
		return nil, 0, s.unavailable("get", err)
	}
	raw, err := get.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, s.unavailable("get", err)
	}
	rec, err := s.codec.Open(key, raw)
	if err != nil {
		return nil, 0, err
	}
	if rec.State == claim.InProgress {
		ttl := max(pttl.Val(), 0)
		// A claim that looks orphaned is judged by its owner's renewals
		// (Record.Expires): its expiry on Redis' clock, read in one script
		// (a second round trip, for these only); the PTTL above is the
		// bound when that read fails.
		if rec.Orphaned(claim.LeaseLeft(rec, ttl)) {
			if v, err := s.eval(ctx, ttlScript, key, 0).Slice(); err == nil {
				if p, now, ok := ttlReply(v); ok && p > 0 {
					ttl, rec.Expires, rec.ReadAt = p, now.Add(p), now
				}
			}
		}
		return rec, claim.LeaseLeft(rec, ttl), nil
	}
	return rec, max(pttl.Val(), 0), nil
}

// noRetry is a command go-redis must not send again once it was written
// (it still retries one that never left: a dial that failed). A claim's
// SET resent after a broken connection could land after its owner gave up
// and cleaned it up (proxy's unconfirmed claims), inside the confirm
// window: a claim nobody owns, which no retry could tell from a forwarded
// one. A pipeline holding one is not resent either.
type noRetry struct{ redis.Cmder }

// NoRetry tells go-redis not to resend the command.
func (noRetry) NoRetry() bool { return true }

// claimCounted is Claim with the count in the claim's pipeline (no
// WAIT): the claim script, INCR and PEXPIRE NX in one round trip; a claim
// that finds an existing key takes its count back. errNoScript: the
// script was not cached (loaded now; nothing claimed, nothing counted).
func (s *Store) claimCounted(ctx context.Context, key string, rec *claim.Record, lease time.Duration, q claim.Quota) (claim.Result, error) {
	value := s.codec.Encode(key, rec)
	run := claimCmd(ctx, key, value, lease+rec.Tail, s.streamLimit)
	incr := redis.NewIntCmd(ctx, "incr", q.Key)
	expire := redis.NewCmd(ctx, "pexpire", q.Key, q.Window.Milliseconds(), "nx")
	cmds, epoch, master := s.withEpochRead(ctx, key, rec, noRetry{run}, incr, expire)
	if err := s.exec(ctx, len(value), cmds...); err != nil {
		return claim.Result{}, s.unavailable("claim", err)
	}
	s.noteEpochRead(master, epoch)
	s.windowFallback(ctx, q, incr, expire)
	if redis.HasErrorPrefix(run.Err(), "NOSCRIPT") {
		s.uncount(ctx, q, incr)
		if err := claimScript.Load(ctx, s.client).Err(); err != nil {
			return claim.Result{}, s.unavailable("claim", err)
		}
		return claim.Result{}, errNoScript
	}
	res, err := s.claimReply(key, rec, run)
	if err != nil || !res.Claimed {
		s.uncount(ctx, q, incr)
		return res, err
	}
	return s.overQuota(ctx, key, rec, q, res, incr)
}

// overQuota undoes a claim that went beyond q: the key is released, the
// count taken back, and the caller told when the window ends. A counter
// that failed to count lets the claim stand: the quota protects Redis, it
// is not a reason to refuse a payment when Redis hiccups.
func (s *Store) overQuota(ctx context.Context, key string, rec *claim.Record, q claim.Quota, res claim.Result, incr *redis.IntCmd) (claim.Result, error) {
	n, err := incr.Result()
	if err != nil || n <= q.Limit {
		return res, nil
	}
	if err := s.Release(ctx, key, rec.Token); err != nil {
		return res, nil // the claim stands; it will be settled as any other
	}
	s.uncount(ctx, q, incr)
	ttl, err := s.client.PTTL(ctx, q.Key).Result()
	if err != nil || ttl <= 0 {
		ttl = q.Window
	}
	return claim.Result{}, &claim.QuotaError{RetryAfter: ttl}
}

// windowFallback starts the window where Redis refused PEXPIRE NX (Redis
// < 7.0): when this count opened the window, a plain PEXPIRE sets it, so a
// counter never outlives its window.
func (s *Store) windowFallback(ctx context.Context, q claim.Quota, incr *redis.IntCmd, expire *redis.Cmd) {
	if expire.Err() != nil && incr.Err() == nil && incr.Val() == 1 {
		_ = s.client.PExpire(ctx, q.Key, q.Window).Err()
	}
}

// uncount takes back a count that did not take a new key.
func (s *Store) uncount(ctx context.Context, q claim.Quota, incr *redis.IntCmd) {
	if incr.Err() == nil {
		_ = s.client.Decr(ctx, q.Key).Err()
	}
}
