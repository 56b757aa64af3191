package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/loopback"
)

// Cluster is a Redis Cluster of real redis-server processes on loopback.
type Cluster struct {
	// Masters and Replicas are the nodes, replica i following master i.
	Masters, Replicas []*Server
}

// Addrs are the masters' addresses, the seeds a cluster client needs.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, m := range c.Masters {
		out = append(out, m.Addr)
	}
	return out
}

// StartCluster starts masters × (1 + replicas) nodes, assigns the 16384
// slots evenly over the masters, and waits until the cluster is ok. Like
// Start, it skips (or fails under IDEMPROXY_REQUIRE_REDIS=1) without
// redis-server.
func StartCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0"}
	c := &Cluster{}
	for range masters {
		c.Masters = append(c.Masters, Start(t, args...))
	}
	for range masters * replicas {
		c.Replicas = append(c.Replicas, Start(t, args...))
	}
	ctx := context.Background()
	first := c.Masters[0].Client()
	per := 16384 / masters
	for i, m := range c.Masters {
		lo, hi := i*per, (i+1)*per-1
		if i == masters-1 {
			hi = 16383
		}
		if err := m.Client().Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatalf("cluster addslots: %v", err)
		}
	}
	for _, n := range append(c.Masters[1:], c.Replicas...) {
		host, port := splitAddr(n.Addr)
		if err := first.Do(ctx, "CLUSTER", "MEET", host, port).Err(); err != nil {
			t.Fatalf("cluster meet: %v", err)
		}
	}
	for i, r := range c.Replicas {
		master := c.Masters[i%masters]
		id, err := master.Client().Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "replica "+r.Addr+" knows its master", func() bool {
			return r.Client().Do(ctx, "CLUSTER", "REPLICATE", id).Err() == nil
		})
	}
	waitFor(t, "every replica's link to its master is up", func() bool {
		for _, r := range c.Replicas {
			info, err := r.Client().Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		return true
	})
	waitFor(t, "the cluster is ok on every node", func() bool {
		for _, n := range append(append([]*Server{}, c.Masters...), c.Replicas...) {
			info, err := n.Client().ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(c.Masters)+len(c.Replicas))) {
				return false
			}
		}
		return true
	})
	return c
}

// Sentinel is a master, its replicas and three sentinels watching them.
type Sentinel struct {
	Master     *Server
	Replicas   []*Server
	Sentinels  []*Server
	MasterName string
}

// SentinelAddrs are the sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	var out []string
	for _, n := range s.Sentinels {
		out = append(out, n.Addr)
	}
	return out
}

// StartSentinel starts a master, replicas and three sentinels (quorum 2,
// down-after 1s) and waits until every sentinel sees the replicas and the
// other sentinels.
func StartSentinel(t testing.TB, replicas int) *Sentinel {
	t.Helper()
	return StartSentinelAuth(t, replicas, "", "")
}

// StartSentinelAuth is StartSentinel with requirepass: dataPass on the
// master and replicas, sentinelPass on the sentinels (either may be empty).
func StartSentinelAuth(t testing.TB, replicas int, dataPass, sentinelPass string) *Sentinel {
	t.Helper()
	// No diskless-sync delay: by default the master waits 5 s for more
	// replicas before the first sync, and a test would fail over an empty
	// replica.
	args := []string{"--repl-diskless-sync-delay", "0"}
	if dataPass != "" {
		args = append(args, "--requirepass", dataPass, "--masterauth", dataPass)
	}
	s := &Sentinel{MasterName: "idemproxy", Master: Start(t, args...)}
	s.Master.password = dataPass
	host, port := splitAddr(s.Master.Addr)
	for range replicas {
		r := Start(t, append([]string{"--replicaof", host, port}, args...)...)
		r.password = dataPass
		s.Replicas = append(s.Replicas, r)
	}
	ctx := context.Background()
	waitFor(t, "every replica's link to the master is up", func() bool {
		for _, r := range s.Replicas {
			info, err := r.Client().Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		return true
	})
	for range 3 {
		s.Sentinels = append(s.Sentinels, startSentinel(t, s.MasterName, host, port, dataPass, sentinelPass))
	}
	waitFor(t, "the sentinels see the replicas and each other", func() bool {
		for _, n := range s.Sentinels {
			c := n.Client()
			reps, err1 := c.Do(ctx, "SENTINEL", "REPLICAS", s.MasterName).Slice()
			sents, err2 := c.Do(ctx, "SENTINEL", "SENTINELS", s.MasterName).Slice()
			if err1 != nil || err2 != nil || len(reps) < replicas || len(sents) < 2 {
				return false
			}
		}
		return true
	})
	return s
}

// startSentinel runs redis-server in sentinel mode with a config file of
// its own (sentinels rewrite it).
func startSentinel(t testing.TB, name, host, port, dataPass, sentinelPass string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Start(t) // skips or fails with the usual message
	}
	dir := t.TempDir()
	for range 5 {
		p, err := loopback.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel resolve-hostnames no
sentinel monitor %s %s %s 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 5000
sentinel parallel-syncs %s 1
`, p, dir, name, host, port, name, name, name)
		if dataPass != "" {
			text += fmt.Sprintf("sentinel auth-pass %s %s\n", name, dataPass)
		}
		if sentinelPass != "" {
			// Its own password, and the one it gives the other sentinels.
			text += fmt.Sprintf("requirepass %s\nsentinel sentinel-pass %s\n", sentinelPass, sentinelPass)
		}
		os.WriteFile(conf, []byte(text), 0o644)
		s := &Server{t: t, bin: bin, dir: dir, Addr: "127.0.0.1:" + strconv.Itoa(p), password: sentinelPass}
		if err := s.startWith(conf, "--sentinel"); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatal("could not start a sentinel")
	return nil
}

func splitAddr(addr string) (host, port string) {
	i := strings.LastIndexByte(addr, ':')
	return addr[:i], addr[i+1:]
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends the server with SIGKILL, as a crash would, without waiting for
// it to flush anything.
func (s *Server) Kill() { s.Stop() }

// Role returns the server's replication role ("master" or "slave").
func (s *Server) Role(ctx context.Context) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return ""
}
