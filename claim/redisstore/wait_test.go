package redisstore_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// TestWaitReplicas: with WAIT 1 and one replica, claims and completions are
// acknowledged and on the replica when they return; asking for more
// replicas than exist reports every write as short, without failing it.
// The same holds for the Lua claim of Redis < 7.0, also after Redis lost
// its script cache, and on a Cluster, where the WAIT must reach the key's
// master on the connection that wrote (sent as a keyless command through
// the Cluster client, it would go to any node and count nothing).
func TestWaitReplicas(t *testing.T) {
	t.Parallel() // on servers of its own
	ctx := context.Background()
	sentinel := redistest.StartSentinel(t, 1)
	cluster := redistest.StartCluster(t, 3, 1)
	for _, topo := range []struct {
		name string
		cfg  redisstore.ClientOptions
		// replica returns the replica that follows key's master.
		replica func(c redis.UniversalClient, key string) *redis.Client
	}{
		{"sentinel", redisstore.ClientOptions{Addrs: sentinel.SentinelAddrs(), MasterName: sentinel.MasterName},
			func(redis.UniversalClient, string) *redis.Client { return sentinel.Replicas[0].Client() }},
		{"cluster", redisstore.ClientOptions{Addrs: cluster.Addrs()},
			func(c redis.UniversalClient, key string) *redis.Client {
				master, err := c.(*redis.ClusterClient).MasterForKey(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				for i, m := range cluster.Masters {
					if m.Addr == master.Options().Addr {
						return cluster.Replicas[i].Client()
					}
				}
				t.Fatalf("no master at %s", master.Options().Addr)
				return nil
			}},
	} {
		c, _ := redisstore.NewClient(topo.cfg)
		defer c.Close()
		for _, flushed := range []bool{false, true} {
			for _, tc := range []struct {
				want      int
				wantShort map[string]int
			}{{1, map[string]int{}}, {2, map[string]int{"claim": 1, "complete": 1}}} {
				var mu sync.Mutex
				short := map[string]int{}
				s := redisstore.New(c, "wait:", claim.WithWait(tc.want, 50*time.Millisecond, func(op string) {
					mu.Lock()
					defer mu.Unlock()
					short[op]++
				}))
				if flushed {
					if err := c.ScriptFlush(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				}
				what := fmt.Sprintf("%s, script cache flushed %v, wait_replicas=%d with one replica", topo.name, flushed, tc.want)
				key := s.Codec().Key("alice", "r", time.Now().String())
				rec := contract.NewRecord(t)
				if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
					t.Fatalf("%s: claim: %+v %v", what, res, err)
				}
				if len(tc.wantShort) == 0 && !onReplica(ctx, topo.replica(c, key), key) {
					t.Errorf("%s: an acknowledged claim is not on the replica", what)
				}
				if _, err := s.Complete(ctx, key, contract.Completed(rec, "x"), time.Hour); err != nil {
					t.Fatalf("%s: complete: %v", what, err)
				}
				mu.Lock()
				if !maps.Equal(short, tc.wantShort) {
					t.Errorf("%s: short WAITs %v, want %v", what, short, tc.wantShort)
				}
				mu.Unlock()
			}
		}
	}

	// On the Cluster, WAIT must go to the key's own master: with that
	// master's replica down, every claim and completion of its keys is
	// short, even though the other masters' replicas are up (a WAIT sent to
	// one of them would count its replica and report nothing).
	c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: cluster.Addrs()})
	defer c.Close()
	var mu sync.Mutex
	short := map[string]int{}
	s := redisstore.New(c, "wait-down:", claim.WithWait(1, 50*time.Millisecond, func(op string) {
		mu.Lock()
		defer mu.Unlock()
		short[op]++
	}))
	cc := c.(*redis.ClusterClient)
	first, err := cc.MasterForKey(ctx, s.Codec().Key("alice", "r", "k0"))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range cluster.Masters {
		if m.Addr == first.Options().Addr {
			cluster.Replicas[i].Kill()
		}
	}
	const keys = 6
	for i, n := 0, 0; n < keys; i++ {
		key := s.Codec().Key("alice", "r", fmt.Sprintf("k%d", i))
		if m, err := cc.MasterForKey(ctx, key); err != nil || m.Options().Addr != first.Options().Addr {
			continue // another shard's key
		}
		n++
		rec := contract.NewRecord(t)
		if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
			t.Fatalf("claim with the shard's replica down: %+v %v", res, err)
		}
		if _, err := s.Complete(ctx, key, contract.Completed(rec, "x"), time.Hour); err != nil {
			t.Fatalf("complete with the shard's replica down: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[string]int{"claim": keys, "complete": keys}; !maps.Equal(short, want) {
		t.Errorf("cluster, the key's shard without its replica: short WAITs %v, want %v", short, want)
	}
}

// onReplica reports whether key is on replica. A Cluster replica answers
// reads only on a connection that sent READONLY (others get MOVED); other
// replicas refuse READONLY and answer anyway.
func onReplica(ctx context.Context, replica *redis.Client, key string) bool {
	conn := replica.Conn()
	defer conn.Close()
	_ = conn.ReadOnly(ctx).Err()
	return conn.Exists(ctx, key).Val() == 1
}

// TestSentinelAuth: sentinels with a password of their own are reached with
// sentinel_password while the data nodes take password; with only the data
// password, the sentinels refuse the client.
func TestSentinelAuth(t *testing.T) {
	t.Parallel() // on servers of its own
	topo := redistest.StartSentinelAuth(t, 1, "data-pw", "sentinel-pw")
	ctx := context.Background()
	claimOnce := func(cfg redisstore.ClientOptions) error {
		c, _ := redisstore.NewClient(cfg)
		defer c.Close()
		s := redisstore.New(c, "auth:")
		_, err := s.Claim(ctx, s.Codec().Key("alice", "r", time.Now().String()), contract.NewRecord(t), 10*time.Second, claim.Quota{})
		return err
	}
	base := redisstore.ClientOptions{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName, Password: "data-pw"}
	withSentinel := base
	withSentinel.SentinelPassword = "sentinel-pw"
	if err := claimOnce(withSentinel); err != nil {
		t.Fatalf("claim with sentinel_password: %v", err)
	}
	if err := claimOnce(base); err == nil {
		t.Fatal("claim without sentinel_password succeeded against password-protected sentinels")
	}
}
