package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// The concurrency guarantee on the deployments users scale out to.
func TestConcurrentDuplicatesOnTopologies(t *testing.T) {
	t.Parallel() // on its own store and servers; mostly waiting: runs beside the others (go test ./... time)
	for name, start := range map[string]func(t *testing.T) redisstore.ClientOptions{
		"cluster": func(t *testing.T) redisstore.ClientOptions {
			return redisstore.ClientOptions{Addrs: redistest.StartCluster(t, 3, 1).Addrs()}
		},
		"sentinel": func(t *testing.T) redisstore.ClientOptions {
			s := redistest.StartSentinel(t, 1)
			return redisstore.ClientOptions{Addrs: s.SentinelAddrs(), MasterName: s.MasterName}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnvStore(t, nil, start(t), slow(150*time.Millisecond, created), nil)
			// Several keys, so that on the Cluster they land on different masters.
			for k := range 6 {
				key := fmt.Sprintf("k-%d", k)
				results := burst(t, e, 40, req{user: "alice", key: key, body: `{"amount":100}`})
				e.ledger.mu.Lock()
				n := e.ledger.calls[key]
				e.ledger.mu.Unlock()
				if n != 1 {
					t.Fatalf("%s: upstream executed %d times for one key, want 1", key, n)
				}
				for _, r := range results {
					if r.status != http.StatusCreated && r.status != http.StatusConflict {
						t.Fatalf("%s: unexpected %d %s", key, r.status, r.body)
					}
				}
			}
		})
	}
}

// TestFailover kills a master mid-load, on Sentinel and on a Cluster
// shard, and reports what the failover cost: failed requests (and their
// statuses), completed records the promoted replica lacks, and the
// duplicate executions those cause. Replication is asynchronous, so this is
// measured, not promised; the figures are in docs/scaling.md. Run with -v
// to see them.
func TestFailover(t *testing.T) {
	t.Parallel() // on its own store and servers; mostly waiting: runs beside the others (go test ./... time)
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel() // each on its own topology; the load loops are bounded in time
		topo := redistest.StartSentinel(t, 1)
		failover(t, redisstore.ClientOptions{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName}, 0, topo.Master, topo.Replicas[0])
	})
	t.Run("sentinel with wait_replicas 1", func(t *testing.T) {
		t.Parallel() // each on its own topology; the load loops are bounded in time
		topo := redistest.StartSentinel(t, 1)
		failover(t, redisstore.ClientOptions{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName}, 1, topo.Master, topo.Replicas[0])
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel() // each on its own topology; the load loops are bounded in time
		topo := redistest.StartCluster(t, 3, 1)
		failover(t, redisstore.ClientOptions{Addrs: topo.Addrs()}, 0, topo.Masters[0], topo.Replicas[0])
	})
	t.Run("cluster with wait_replicas 1", func(t *testing.T) {
		t.Parallel() // each on its own topology; the load loops are bounded in time
		topo := redistest.StartCluster(t, 3, 1)
		failover(t, redisstore.ClientOptions{Addrs: topo.Addrs()}, 1, topo.Masters[0], topo.Replicas[0])
	})
}

func failover(t *testing.T, store redisstore.ClientOptions, waitReplicas int, master, replica *redistest.Server) {
	e := newEnvStore(t, nil, store, created, func(c *setup) {
		c.Routes[0].Lease = 2 * time.Second
		c.WaitReplicas = waitReplicas
		c.WaitTimeout = 100 * time.Millisecond
	})
	var mu sync.Mutex
	var completed []string
	var lastFailure time.Time
	statuses := map[int]int{}
	var seq atomic.Int64
	stop := time.Now().Add(8 * time.Second)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				key := fmt.Sprintf("f-%d", seq.Add(1))
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				r, err := e.try(ctx, req{user: "alice", key: key, body: `{"amount":1}`})
				cancel()
				mu.Lock()
				if err != nil {
					statuses[0]++
				} else {
					statuses[r.status]++
					if r.status == http.StatusCreated {
						completed = append(completed, key)
					}
				}
				if err != nil || r.status != http.StatusCreated {
					lastFailure = time.Now()
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	time.Sleep(2 * time.Second)
	ctx := context.Background()
	killed := time.Now()
	master.Kill()
	// Usually 1-3 s; a failed first election on a loaded machine retries
	// after 2 x failover-timeout (10 s).
	for replica.Role(ctx) != "master" {
		if time.Since(killed) > 45*time.Second {
			t.Fatal("the replica was not promoted within 45 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	promoted := time.Since(killed)
	wg.Wait()
	poll.Until(t, "requests succeed after the failover", func() bool {
		return e.do(req{user: "alice", key: "after-" + fmt.Sprint(time.Now().UnixNano()), body: `{}`}).status == http.StatusCreated
	})

	// Every completed key retried once more: a record the new master lacks
	// executes again. Retried by 16 clients: with wait_replicas and no
	// replica left after the failover, every write waits wait_timeout.
	before := e.ledger.Total()
	var lost atomic.Int64
	keys := make(chan string)
	var rwg sync.WaitGroup
	for range 16 {
		rwg.Go(func() {
			for key := range keys {
				deadline := time.Now().Add(20 * time.Second)
				for {
					r := e.do(req{user: "alice", key: key, body: `{"amount":1}`})
					if r.status == http.StatusCreated {
						if r.header.Get("Idempotent-Replayed") != "true" {
							lost.Add(1)
						}
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("retry of %s still answered %d %s", key, r.status, r.body)
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	for _, key := range completed {
		keys <- key
	}
	close(keys)
	rwg.Wait()
	dups := e.ledger.Total() - before
	var parts []string
	for _, s := range []int{http.StatusCreated, http.StatusServiceUnavailable, http.StatusConflict, 0} {
		if statuses[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d x %d", statuses[s], s))
		}
	}
	unavailable := time.Duration(0)
	if lastFailure.After(killed) {
		unavailable = lastFailure.Sub(killed)
	}
	t.Logf("replica promoted %s after SIGKILL of the master; last failed request %s after it; %d requests in 8 s (%s; 0 = client timeout at 3 s); %d of %d completed records missing after failover, %d duplicate executions when their keys were retried; %d WAITs short",
		promoted.Round(100*time.Millisecond), unavailable.Round(100*time.Millisecond), seq.Load(), strings.Join(parts, ", "), lost.Load(), len(completed), dups, e.waitShort.Load())
	if int(lost.Load()) != dups {
		t.Errorf("%d retries were not replays but %d executions happened", lost.Load(), dups)
	}
	if statuses[http.StatusCreated] == 0 {
		t.Fatal("no request succeeded")
	}
}
