package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// stack is one redis-server, the bench upstream and one idemproxy, each
// its own process on 127.0.0.1, for the overload and soak modes.
type stack struct {
	dir             string
	redis, up, idem *proc
	rdb             *redis.Client
	base, admin     string
}

// stackConfig is idemproxy's configuration in a stack: one protected
// route, POST /payments, with route's extra settings.
const stackConfig = `listen: %q
admin_listen: %q
upstream:
  url: %q
store:
  redis:
    addrs: [%q]
routes:
  - name: pay
    match: "POST /payments"
%s`

// startStack builds idemproxy and starts the three processes: the
// upstream with upArgs, idemproxy with route settings route and env.
func startStack(upArgs []string, route string, env []string) (s *stack, err error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redis-server not found: apt-get install -y redis-server")
	}
	s = &stack{}
	if s.dir, err = os.MkdirTemp("", "idemproxy-bench-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	bin, err := buildIdemproxy(s.dir)
	if err != nil {
		return nil, err
	}
	redisPort := freePort()
	redisAddr := fmt.Sprintf("127.0.0.1:%d", redisPort)
	if s.redis, err = startProc("redis", redisAddr, "redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction", "--dir", s.dir); err != nil {
		return nil, err
	}
	s.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, DisableIdentity: true})
	upAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	if s.up, err = startProc("upstream", upAddr, self, append([]string{"upstream", "-listen", upAddr, "-count"}, upArgs...)...); err != nil {
		return nil, err
	}
	port, admin := freePort(), freePort()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s.admin = fmt.Sprintf("127.0.0.1:%d", admin)
	cfg := filepath.Join(s.dir, "idemproxy.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, stackConfig, addr, s.admin, "http://"+upAddr, redisAddr, route), 0o644); err != nil {
		return nil, err
	}
	if s.idem, err = startIdemproxy(bin, cfg, port, admin, env); err != nil {
		return nil, err
	}
	s.base = "http://" + addr
	return s, nil
}

func (s *stack) stop() {
	for _, p := range []*proc{s.idem, s.up, s.redis} {
		if p != nil {
			p.stop()
		}
	}
	if s.rdb != nil {
		s.rdb.Close()
	}
	os.RemoveAll(s.dir)
}

// duplicates is how many executions at the upstream repeated a key.
func (s *stack) duplicates() (keys, dups int, err error) {
	resp, err := http.Get("http://" + s.up.addr + "/_executions")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var v struct{ Keys, Duplicates int }
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Keys, v.Duplicates, err
}

// gauge reads one unlabelled gauge from idemproxy's /metrics.
func (s *stack) gauge(name string) float64 {
	resp, err := http.Get("http://" + s.admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// rss is the process's resident set now (VmRSS), in bytes.
func (p *proc) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// fds is how many file descriptors the process holds open.
func (p *proc) fds() int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid()))
	return len(es)
}

// redisKeys is DBSIZE and used_memory.
func (s *stack) redisKeys() (keys, bytes int64) {
	ctx := context.Background()
	keys, _ = s.rdb.DBSize(ctx).Result()
	info, _ := s.rdb.Info(ctx, "memory").Result()
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			bytes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return keys, bytes
}

// call is one request of an open-loop run: its class, status (0: a
// transport error) and latency from its scheduled time.
type call struct {
	class  string
	at     time.Duration // scheduled, from the run's start
	status int
	lat    time.Duration
}

// calls collects calls from many goroutines.
type calls struct {
	mu  sync.Mutex
	all []call
}

func (c *calls) add(x call) {
	c.mu.Lock()
	c.all = append(c.all, x)
	c.mu.Unlock()
}

// openLoop calls do about rate times a second until stop is closed, with
// at most workers calls at once; a call's latency is counted from its
// scheduled time, so a generator falling behind shows as latency
// (no coordinated omission). It returns once every call returned.
func openLoop(rate float64, workers int, stop <-chan struct{}, do func(n int64, scheduled time.Time)) {
	sched := make(chan time.Time, workers)
	go func() {
		defer close(sched)
		interval := time.Duration(float64(time.Second) / rate)
		for at := time.Now(); ; at = at.Add(interval) {
			time.Sleep(time.Until(at))
			select {
			case <-stop:
				return
			case sched <- at:
			}
		}
	}()
	var n atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for at := range sched {
				do(n.Add(1), at)
			}
		})
	}
	wg.Wait()
}

// loadClient is the generator's HTTP client: connections for every worker,
// and a timeout past idemproxy's default upstream.timeout (30 s).
func loadClient(workers int) *http.Client {
	return &http.Client{
		Timeout:   40 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true},
	}
}

// post sends the bench's small JSON body to path with key (none when
// empty) and returns the status, 0 on a transport error.
func post(c *http.Client, base, path, key string) int {
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{"amount":1250,"currency":"EUR","customer":"cus_42","description":"order 42"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-User", "bench")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
