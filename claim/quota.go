package claim

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrQuota means the principal has claimed as many new keys on this route
// as its quota allows within the window. Errors matching it are QuotaErrors.
var ErrQuota = errors.New("claim: new-key quota reached")

// QuotaError says when the quota's window ends.
type QuotaError struct {
	// RetryAfter is what is left of the window.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string { return ErrQuota.Error() }

// Is makes every QuotaError an ErrQuota.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Quota bounds the new keys one principal claims on one scope per window,
// counted in Redis, so shared by every replica. Retries and replays of a
// key that exists never count.
type Quota struct {
	// Key is the counter's Redis key (Store.QuotaKey).
	Key string
	// Limit is how many new keys a window allows; 0 counts nothing.
	Limit  int64
	Window time.Duration
}

// QuotaKey is the Redis key of principal's new-key counter on scope,
// derived as Key derives claim keys (with its secret, when one is set).
func (s *Store) QuotaKey(principal, scope string) string {
	h := sha256.New()
	if s.keyMAC != nil {
		h = hmac.New(sha256.New, s.keyMAC)
	}
	frameParts(h, "quota", principal, scope)
	var sum [sha256.Size]byte
	return s.prefix + "q:" + hex.EncodeToString(h.Sum(sum[:0]))
}

// ClaimCounted is Claim, counting the claim against q when it takes a new
// key: a claim beyond the quota is undone and returns a QuotaError. On
// Redis 7 without WAIT the count rides in the claim's round trip (a
// pipeline of SET NX PX GET, INCR and PEXPIRE NX); a claim that finds an
// existing key takes its count back.
func (s *Store) ClaimCounted(ctx context.Context, key string, rec *Record, lease time.Duration, q Quota) (Result, error) {
	if q.Limit <= 0 || s.full.Load() {
		return s.Claim(ctx, key, rec, lease)
	}
	if s.waitReplicas > 0 || s.scriptClaim.Load() {
		res, err := s.Claim(ctx, key, rec, lease)
		if err != nil || !res.Claimed {
			return res, err
		}
		pipe := s.client.Pipeline()
		incr := pipe.Incr(ctx, q.Key)
		expire := pipe.Do(ctx, "PEXPIRE", q.Key, q.Window.Milliseconds(), "NX")
		_, _ = pipe.Exec(ctx)
		s.windowFallback(ctx, q, incr, expire)
		return s.overQuota(ctx, key, rec, q, res, incr)
	}
	value := s.encode(key, rec)
	lease += rec.Tail
	set := setNXGet(ctx, key, value, lease)
	incr := redis.NewIntCmd(ctx, "incr", q.Key)
	expire := redis.NewCmd(ctx, "pexpire", q.Key, q.Window.Milliseconds(), "nx")
	if err := s.exec(ctx, len(value), set, incr, expire); err != nil {
		return Result{}, s.unavailable("claim", err)
	}
	s.windowFallback(ctx, q, incr, expire)
	raw, err := set.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return s.overQuota(ctx, key, rec, q, Result{Claimed: true}, incr)
	case redis.HasErrorPrefix(err, "syntax error"):
		s.uncount(ctx, q, incr)
		s.scriptClaim.Store(true) // Redis < 7.0
		return s.ClaimCounted(ctx, key, rec, lease-rec.Tail, q)
	case err != nil:
		s.uncount(ctx, q, incr)
		return Result{}, s.unavailable("claim", err)
	}
	s.uncount(ctx, q, incr)
	return s.found(ctx, key, rec, raw, lease)
}

// overQuota undoes a claim that went beyond q: the key is released, the
// count taken back, and the caller told when the window ends. A counter
// that failed to count lets the claim stand: the quota protects Redis, it
// is not a reason to refuse a payment when Redis hiccups.
func (s *Store) overQuota(ctx context.Context, key string, rec *Record, q Quota, res Result, incr *redis.IntCmd) (Result, error) {
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
	return Result{}, fmt.Errorf("claim: %w", &QuotaError{RetryAfter: ttl})
}

// windowFallback starts the window where Redis refused PEXPIRE NX (Redis
// < 7.0): when this count opened the window, a plain PEXPIRE sets it, so a
// counter never outlives its window.
func (s *Store) windowFallback(ctx context.Context, q Quota, incr *redis.IntCmd, expire *redis.Cmd) {
	if expire.Err() != nil && incr.Err() == nil && incr.Val() == 1 {
		_ = s.client.PExpire(ctx, q.Key, q.Window).Err()
	}
}

// uncount takes back a count that did not take a new key.
func (s *Store) uncount(ctx context.Context, q Quota, incr *redis.IntCmd) {
	if incr.Err() == nil {
		_ = s.client.Decr(ctx, q.Key).Err()
	}
}
