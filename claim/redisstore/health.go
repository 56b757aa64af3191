package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Health asks every master for its memory and key count (INFO memory
// keyspace, one round trip each), which is also how it learns which are
// up, and for its clock (TIME, one more), which is what keeps claims
// marked (clock.go). The embedded store answers as one master. It is what
// the store watcher calls every second.
func (s *Store) Health(ctx context.Context) []claim.MasterHealth {
	var (
		mu  sync.Mutex
		out []claim.MasterHealth
	)
	read := func(ctx context.Context, name string, c redis.Cmdable) {
		h := claim.MasterHealth{Master: name}
		info, err := c.Info(ctx, "memory", "keyspace").Result()
		var refused redis.Error
		switch {
		case err == nil:
			h.MemoryRatio = memoryRatio(info)
			h.Sized, h.Keys, h.UsedBytes = true, keyCount(info), usedMemory(info)
		case errors.As(err, &refused):
			// It answered with an error: a refused login, or no INFO
			// memory (the embedded store). PING tells which.
			if err := c.Ping(ctx).Err(); err != nil {
				h.Err = s.unavailable("ping", err)
			}
		default:
			h.Err = s.unavailable("info memory", err)
		}
		if h.Err == nil {
			if r, err := readClock(ctx, c, s.clocks.Now); err == nil {
				h.Clock = &r
			}
		}
		mu.Lock()
		out = append(out, h)
		mu.Unlock()
	}
	if err := s.eachMaster(ctx, read); err != nil && len(out) == 0 {
		out = append(out, claim.MasterHealth{Err: s.unavailable("cluster slots", err)})
	}
	answered := len(out) > 0
	readings := make([]claim.ClockReading, 0, len(out))
	for _, h := range out {
		if h.Clock == nil {
			answered = false
			continue
		}
		readings = append(readings, *h.Clock)
	}
	s.clocks.Note(readings, answered, s.clocks.Now())
	return out
}

// eachMaster runs read on every master, named: a Cluster's at once (its
// error is that of a Cluster whose masters could not be listed), or the
// one master of a standalone or Sentinel deployment.
func (s *Store) eachMaster(ctx context.Context, read func(ctx context.Context, name string, c redis.Cmdable)) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			read(ctx, m.Options().Addr, m)
			return nil
		})
	}
	read(ctx, s.masterLabel(), s.client)
	return nil
}

// masterLabel names the one master of a standalone or Sentinel deployment.
func (s *Store) masterLabel() string {
	if s.masterName != "" {
		return s.masterName
	}
	if c, ok := s.client.(*redis.Client); ok {
		return c.Options().Addr
	}
	return ""
}
