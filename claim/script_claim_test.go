package claim

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestScriptClaim covers the Lua claim used on Redis < 7.0, forced here on
// Redis 7 and on the embedded store.
func TestScriptClaim(t *testing.T) {
	e, err := StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for name, addr := range map[string]string{"embedded": e.Addr(), "redis-server": redistest.Start(t).Addr} {
		t.Run(name, func(t *testing.T) {
			c, _ := NewClient(config.Redis{Addrs: []string{addr}})
			defer c.Close()
			s := New(c, "script:")
			s.scriptClaim.Store(true)
			ctx := context.Background()
			key := s.Key("alice", "r", "k")
			first := &Record{State: InProgress, Created: time.UnixMilli(1)}
			first.Token[0] = 1
			if res, err := s.Claim(ctx, key, first, 10*time.Second); err != nil || !res.Claimed {
				t.Fatalf("claim: %+v %v", res, err)
			}
			if res, err := s.Claim(ctx, key, first, 10*time.Second); err != nil || !res.Claimed {
				t.Fatalf("resent claim: %+v %v, want claimed", res, err)
			}
			second := &Record{State: InProgress, Created: time.UnixMilli(1)}
			second.Token[0] = 2
			res, err := s.Claim(ctx, key, second, 10*time.Second)
			if err != nil || res.Claimed || res.Existing.Token != first.Token || res.TTL <= 0 {
				t.Fatalf("conflicting claim: %+v %v, want the first record with its TTL", res, err)
			}
		})
	}
}

// TestScriptClaimWaits: the Lua claim (Redis < 7.0) is followed by WAIT
// like the native one, also after Redis lost its script cache.
func TestScriptClaimWaits(t *testing.T) {
	topo := redistest.StartSentinel(t, 1)
	c, _ := NewClient(config.Redis{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName})
	defer c.Close()
	replica := topo.Replicas[0].Client()
	ctx := context.Background()
	for _, tc := range []struct {
		want      int
		wantShort int64
	}{{1, 0}, {2, 1}} {
		var short atomic.Int64
		s := New(c, "script-wait:", WithWait(tc.want, 50*time.Millisecond, func(op string) {
			if op != "claim" {
				t.Errorf("short WAIT on %s, want claim", op)
			}
			short.Add(1)
		}))
		s.scriptClaim.Store(true)
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		key := s.Key("alice", "r", time.Now().String())
		rec := &Record{State: InProgress, Created: time.UnixMilli(1)}
		rec.Token[0] = byte(tc.want)
		if res, err := s.Claim(ctx, key, rec, 10*time.Second); err != nil || !res.Claimed {
			t.Fatalf("claim: %+v %v", res, err)
		}
		if tc.wantShort == 0 && replica.Exists(ctx, key).Val() != 1 {
			t.Error("an acknowledged script claim is not on the replica")
		}
		if got := short.Load(); got != tc.wantShort {
			t.Errorf("wait_replicas=%d with one replica: %d short WAITs after a script claim, want %d", tc.want, got, tc.wantShort)
		}
	}
}
