package redisstore

import (
	"bufio"
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// SetFull sets whether new claims are refused (ErrFull). Replays, and the
// completions, renewals and releases of claims in flight, go on.
func (s *Store) SetFull(full bool) { s.full.Store(full) }

// claimWhenFull answers a claim while the store is full: a key that holds
// a record is answered from it, as a claim would; a free key is ErrFull.
func (s *Store) claimWhenFull(ctx context.Context, key string, rec *claim.Record, lease time.Duration) (claim.Result, error) {
	raw, err := s.client.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return claim.Result{}, claim.ErrFull
	case err != nil:
		return claim.Result{}, s.unavailable("claim", err)
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

// usedMemory reads used_memory from an INFO reply.
func usedMemory(info string) int64 {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// keyCount sums the keys of every database in an INFO keyspace reply
// ("db0:keys=12,expires=12,avg_ttl=0").
func keyCount(info string) int64 {
	var total int64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(k, "db") {
			continue
		}
		for f := range strings.SplitSeq(v, ",") {
			if n, ok := strings.CutPrefix(f, "keys="); ok {
				x, _ := strconv.ParseInt(n, 10, 64)
				total += x
			}
		}
	}
	return total
}
