package claim_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestWaitReplicas: with WAIT 1 and one replica, claims and completions are
// acknowledged and on the replica when they return; asking for more
// replicas than exist reports every write as short, without failing it.
// The same holds for the Lua claim of Redis < 7.0, also after Redis lost
// its script cache.
func TestWaitReplicas(t *testing.T) {
	topo := redistest.StartSentinel(t, 1)
	c, _ := claim.NewClient(config.Redis{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName})
	defer c.Close()
	replica := topo.Replicas[0].Client()
	ctx := context.Background()
	for _, script := range []bool{false, true} {
		for _, tc := range []struct {
			want      int
			wantShort map[string]int
		}{{1, map[string]int{}}, {2, map[string]int{"claim": 1, "complete": 1}}} {
			var mu sync.Mutex
			short := map[string]int{}
			s := claim.New(c, "wait:", claim.WithWait(tc.want, 50*time.Millisecond, func(op string) {
				mu.Lock()
				defer mu.Unlock()
				short[op]++
			}))
			if script {
				claim.ForceScriptClaim(s)
				if err := c.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			key := s.Key("alice", "r", time.Now().String())
			rec := newRecord(t)
			if res, err := s.Claim(ctx, key, rec, 10*time.Second); err != nil || !res.Claimed {
				t.Fatalf("script claim %v: claim: %+v %v", script, res, err)
			}
			if len(tc.wantShort) == 0 && replica.Exists(ctx, key).Val() != 1 {
				t.Errorf("script claim %v: an acknowledged claim is not on the replica", script)
			}
			if _, err := s.Complete(ctx, key, completed(rec, "x"), time.Hour); err != nil {
				t.Fatalf("script claim %v: complete: %v", script, err)
			}
			mu.Lock()
			if !maps.Equal(short, tc.wantShort) {
				t.Errorf("script claim %v, wait_replicas=%d with one replica: short WAITs %v, want %v", script, tc.want, short, tc.wantShort)
			}
			mu.Unlock()
		}
	}
}

// TestSentinelAuth: sentinels with a password of their own are reached with
// sentinel_password while the data nodes take password; with only the data
// password, the sentinels refuse the client.
func TestSentinelAuth(t *testing.T) {
	topo := redistest.StartSentinelAuth(t, 1, "data-pw", "sentinel-pw")
	ctx := context.Background()
	claimOnce := func(cfg config.Redis) error {
		c, _ := claim.NewClient(cfg)
		defer c.Close()
		s := claim.New(c, "auth:")
		_, err := s.Claim(ctx, s.Key("alice", "r", time.Now().String()), newRecord(t), 10*time.Second)
		return err
	}
	base := config.Redis{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName, Password: "data-pw"}
	withSentinel := base
	withSentinel.SentinelPassword = "sentinel-pw"
	if err := claimOnce(withSentinel); err != nil {
		t.Fatalf("claim with sentinel_password: %v", err)
	}
	if err := claimOnce(base); err == nil {
		t.Fatal("claim without sentinel_password succeeded against password-protected sentinels")
	}
}
