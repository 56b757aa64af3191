package claim

import (
	"bufio"
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrFull means Redis is above the claim memory limit: new claims are
// refused, so that the claims already in flight still find room to store
// their outcome (a full noeviction Redis refuses every write, completions
// included, and a completion refused is a retry that executes again).
var ErrFull = errors.New("claim: store above its claim memory limit")

// SetFull sets whether new claims are refused (ErrFull). Replays, and the
// completions, renewals and releases of claims in flight, go on.
func (s *Store) SetFull(full bool) { s.full.Store(full) }

// claimWhenFull answers a claim while the store is full: a key that holds
// a record is answered from it, as a claim would; a free key is ErrFull.
func (s *Store) claimWhenFull(ctx context.Context, key string, rec *Record, lease time.Duration) (Result, error) {
	raw, err := s.client.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return Result{}, ErrFull
	case err != nil:
		return Result{}, s.unavailable("claim", err)
	}
	return s.found(ctx, key, rec, raw, lease)
}

// memoryRatio reads used_memory / maxmemory from an INFO memory reply.
func memoryRatio(info string) float64 {
	var used, limit float64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			used, _ = strconv.ParseFloat(v, 64)
		case "maxmemory":
			limit, _ = strconv.ParseFloat(v, 64)
		}
	}
	if limit <= 0 {
		return 0
	}
	return used / limit
}
