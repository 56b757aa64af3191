package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat.
const clockTicks = 100

func freePort() int {
	port, err := loopback.FreePort()
	if err != nil {
		panic(err) // a loopback port is always available on the bench machine
	}
	return port
}

// proc is a server process the harness started and stops by its PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	// pidOf, when set, gives the process id instead of cmd (a PostgreSQL
	// server pgtest runs: its postmaster, whose children are its
	// backends).
	pidOf func() int
	// sidecar, for idemproxy, runs it instead of cmd (internal/binarytest).
	sidecar *binarytest.Sidecar
	addr    string
	// shared is a process another target owns: stop leaves it running.
	shared bool
}

// pid is the process' id.
func (p *proc) pid() int {
	if p.sidecar != nil {
		return p.sidecar.PID()
	}
	if p.pidOf != nil {
		return p.pidOf()
	}
	return p.cmd.Process.Pid
}

// startIdemproxy runs bin on cfg, which listens on port with its admin
// listener on admin, through internal/binarytest: ready when /readyz
// answers 200.
func startIdemproxy(bin, cfg string, port, admin int, env []string) (*proc, error) {
	sc := binarytest.New(bin, cfg, port, admin)
	var out io.Writer = io.Discard
	if os.Getenv("BENCH_DEBUG") == "1" {
		out = os.Stderr
	}
	if err := sc.Run(binarytest.Options{Env: env, Stderr: nopCloser{out}}); err != nil {
		return nil, err
	}
	return &proc{name: "idemproxy", sidecar: sc, addr: fmt.Sprintf("127.0.0.1:%d", port)}, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// startProc starts bin and waits until it listens on addr.
func startProc(name, addr string, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = io.Discard
	if os.Getenv("BENCH_DEBUG") == "1" {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, addr: addr}
	for range 400 {
		if c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond); err == nil {
			c.Close()
			return p, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("%s did not listen on %s", name, addr)
}

func (p *proc) stop() {
	if p.sidecar != nil && !p.shared {
		p.sidecar.Kill()
		return
	}
	if p.shared || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	children := p.pids()[1:]
	if len(children) == 0 {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		return
	}
	// nginx: its workers outlive a killed master (and keep its port), so
	// the master is asked to stop them and reap them (SIGTERM); whatever is
	// left after 5 s is killed by the PIDs found before.
	exited := make(chan struct{})
	go func() { p.cmd.Wait(); close(exited) }()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-exited
	}
	for _, pid := range children {
		if child, err := os.FindProcess(pid); err == nil {
			child.Kill() // fails harmlessly once the master reaped it
		}
	}
}

// pids are the process and its children (nginx workers).
func (p *proc) pids() []int {
	pids := []int{p.pid()}
	out, _ := exec.Command("pgrep", "-P", strconv.Itoa(p.pid())).Output()
	for f := range strings.FieldsSeq(string(out)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// cpuSeconds is user+system CPU time of the process and its children.
func (p *proc) cpuSeconds() float64 {
	total := 0.0
	for _, pid := range p.pids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		total += (ut + st) / clockTicks
	}
	return total
}

// cpuPrecise is the CPU time of the process and its children, to the
// nanosecond: the scheduler's runtime of each of their threads
// (/proc/<pid>/task/<tid>/schedstat), where /proc/<pid>/stat counts in
// clock ticks (10 ms, too coarse for a round of streams). A thread that
// exited is not counted; Go's rarely do. Where schedstat is missing it
// is cpuSeconds.
func (p *proc) cpuPrecise() float64 {
	cpu, _, ok := p.schedstat()
	if !ok {
		return p.cpuSeconds()
	}
	return cpu
}

// schedstat sums the schedstat of the threads of the process and its
// children: seconds on a CPU, and how many times a thread was put on one
// (each wake-up of a sleeping thread is one; false when it cannot be
// read).
func (p *proc) schedstat() (cpu, runs float64, ok bool) {
	for _, pid := range p.pids() {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return 0, 0, false
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
			if err != nil {
				continue // exited meanwhile
			}
			f := strings.Fields(string(b))
			if len(f) < 3 {
				return 0, 0, false
			}
			ns, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, 0, false
			}
			n, _ := strconv.ParseFloat(f[2], 64)
			cpu, runs = cpu+ns/1e9, runs+n
		}
	}
	return cpu, runs, true
}

// peakRSS is the sum of VmHWM over the process and its children, in bytes.
func (p *proc) peakRSS() int64 {
	var total int64
	for _, pid := range p.pids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// target is one thing measured.
type target struct {
	name  string
	start func() (*proc, error) // a fresh process per measurement
	path  string
	body  []byte
	keyed bool // send a unique Idempotency-Key per request
	// store, when set, is the store whose CPU is measured instead of
	// Redis' (PostgreSQL's, for the targets on store.postgres).
	store   *proc
	replay  []string // keys to replay at random instead
	prepare func(base string) ([]string, error)
	// firstSent sends Repeatability-First-Sent (now) with every request.
	firstSent bool
	// grpc makes each request a unary gRPC call over HTTP/2 without TLS.
	grpc bool
}

type result struct {
	name                 string
	delay                time.Duration
	requests             int
	errors               int
	rps                  float64
	p50, p99, p999       time.Duration
	cpuPer1k, redisPer1k float64
	rss                  int64
	// rpsMin and rpsMax span the rounds; the other figures are those of
	// the round with the median rps.
	rpsMin, rpsMax float64
	rounds         int
	// quantiles are the latencies at plotQuantiles.
	quantiles []time.Duration
}

// median is the run with the median rps, carrying the spread of all.
func median(rs []result) result {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b result) int { return cmp.Compare(a.rps, b.rps) })
	m := sorted[len(sorted)/2]
	m.rpsMin, m.rpsMax, m.rounds = sorted[0].rps, sorted[len(sorted)-1].rps, len(sorted)
	return m
}

// load runs the generator against base for d and returns latencies.
func load(o options, base string, t *target, d time.Duration, seq *atomic.Int64) (lat []time.Duration, errs int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency * 2, DisableCompression: true}}
	if t.grpc {
		client = h2cClient(o.concurrency * 2)
	}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sched := schedule(o, deadline)
	for w := range o.concurrency {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			for n := 0; ; n++ {
				start := time.Now()
				if sched != nil {
					at, ok := <-sched
					if !ok {
						break
					}
					start = at // latency from the scheduled time: no coordinated omission
				} else if !start.Before(deadline) {
					break
				}
				if err := send(client, base, t, w, n, seq); err != nil {
					bad++
					continue
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	return lat, errs
}

// schedule is the fixed rate's send times until deadline, at o.rate per
// second; nil in a closed loop (o.rate 0).
func schedule(o options, deadline time.Time) chan time.Time {
	if o.rate <= 0 {
		return nil
	}
	sched := make(chan time.Time, o.concurrency)
	go func() {
		defer close(sched)
		interval := time.Duration(float64(time.Second) / o.rate)
		for at := time.Now(); at.Before(deadline); at = at.Add(interval) {
			time.Sleep(time.Until(at))
			sched <- at
		}
	}()
	return sched
}

// send is worker w's n-th request to t: an error unless answered 201.
func send(client *http.Client, base string, t *target, w, n int, seq *atomic.Int64) error {
	req, _ := http.NewRequest(http.MethodPost, base+t.path, bytes.NewReader(t.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-User", "bench")
	if t.firstSent {
		req.Header.Set("Repeatability-First-Sent", time.Now().UTC().Format(http.TimeFormat))
	}
	switch {
	case len(t.replay) > 0:
		req.Header.Set("Idempotency-Key", t.replay[(w*7919+n)%len(t.replay)])
	case t.keyed:
		req.Header.Set("Idempotency-Key", "k-"+strconv.FormatInt(seq.Add(1), 36))
	}
	if t.grpc {
		return sendGRPC(client, req)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func measure(o options, t *target, delay time.Duration, redisProc *proc, seq *atomic.Int64) (result, error) {
	p, err := t.start()
	if err != nil {
		return result{}, err
	}
	defer p.stop()
	base := "http://" + p.addr
	if t.prepare != nil {
		if t.replay, err = t.prepare(base); err != nil {
			return result{}, err
		}
	}
	load(o, base, t, o.warmup, seq)
	if t.store != nil {
		redisProc = t.store
	}
	cpu0, rcpu0 := p.cpuSeconds(), redisProc.cpuSeconds()
	start := time.Now()
	lat, errs := load(o, base, t, o.duration, seq)
	elapsed := time.Since(start)
	cpu, rcpu := p.cpuSeconds()-cpu0, redisProc.cpuSeconds()-rcpu0
	if len(lat) == 0 {
		return result{}, fmt.Errorf("%s: no successful request (%d errors)", t.name, errs)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
	var qs []time.Duration
	for _, f := range plotQuantiles {
		qs = append(qs, q(f))
	}
	return result{
		quantiles: qs,
		name:      t.name, delay: delay, requests: len(lat), errors: errs,
		rps: float64(len(lat)) / elapsed.Seconds(), p50: q(.50), p99: q(.99), p999: q(.999),
		cpuPer1k: cpu / float64(len(lat)) * 1000, redisPer1k: rcpu / float64(len(lat)) * 1000,
		rss: p.peakRSS(),
	}, nil
}

// redisRTT measures PING round trips from this process.
func redisRTT(addr string) (p50, p99 time.Duration) {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	ctx := context.Background()
	var lat []time.Duration
	for range 5000 {
		start := time.Now()
		if c.Ping(ctx).Err() == nil {
			lat = append(lat, time.Since(start))
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// pgConfig is idemproxyConfig on the PostgreSQL store.
const pgConfig = `listen: %q
admin_listen: "127.0.0.1:%d"
log_level: info
upstream:
  url: %q
store:
  postgres:
    url: %q
defaults:
  max_request_body: 2MiB
  max_response_body: 1MiB
%sroutes:
  - name: pay
    match: "POST /payments"
`

const idemproxyConfig = `listen: %q
admin_listen: "127.0.0.1:%d"
log_level: %s
upstream:
  url: %q
store:
  pipeline: %t
  redis:
    addrs: [%q]
defaults:
  max_request_body: 2MiB
  max_response_body: 1MiB
routes:
  - name: pay
    match: "POST /payments"
`

func bench(o options, dir, self, bin, fiberBin, prevBin, prevVersion string) error {
	redisPort := freePort()
	redisAddr := fmt.Sprintf("127.0.0.1:%d", redisPort)
	redisProc, err := startProc("redis", redisAddr, "redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction", "--dir", dir)
	if err != nil {
		return err
	}
	defer redisProc.stop()
	rttP50, rttP99 := redisRTT(redisAddr)
	// PostgreSQL (the durable store's targets), when installed.
	var pg *pgtest.Server
	if pg, err = pgtest.Launch(); err != nil {
		fmt.Fprintf(os.Stderr, "PostgreSQL not started (%v): its targets are skipped\n", err)
		pg = nil
	} else {
		defer pg.Close()
	}

	var seq atomic.Int64
	var results []result
	for _, delay := range o.delays {
		upAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
		up, err := startProc("upstream", upAddr, self, "upstream", "-listen", upAddr, "-delay", delay.String())
		if err != nil {
			return err
		}
		targets := benchTargets(dir, self, bin, fiberBin, prevBin, prevVersion, redisAddr, up, upAddr, delay)
		if pg != nil {
			targets = append(targets, pgTargets(dir, bin, pg, upAddr, delay)...)
		}
		rs, err := rounds(o, targets, delay, redisProc, &seq)
		up.stop()
		if err != nil {
			return err
		}
		results = append(results, rs...)
	}
	text := report(o, results, rttP50, rttP99)
	fmt.Print(text)
	if o.plot != "" {
		if err := os.WriteFile(o.plot, plot(o, results), 0o644); err != nil {
			return err
		}
	}
	if o.out != "" {
		return os.WriteFile(o.out, []byte(text), 0o644)
	}
	return nil
}

// benchTargets are the servers measured against the upstream at upAddr
// (delay): the direct upstream, plain proxies, and idemproxy's and
// Fiber's paths.
func benchTargets(dir, self, bin, fiberBin, prevBin, prevVersion, redisAddr string, up *proc, upAddr string, delay time.Duration) []*target {
	st := starters{dir: dir, self: self, redisAddr: redisAddr, upAddr: upAddr, upURL: "http://" + upAddr}
	small := []byte(`{"amount":1250,"currency":"EUR","customer":"cus_42","description":"order 42"}`)
	direct := func() (*proc, error) { return &proc{name: "direct", cmd: up.cmd, addr: upAddr, shared: true}, nil }
	idem := st.idemproxy(bin, "info", true)
	seed := seeder(fmt.Sprintf("replay-%d", delay), small)
	targets := []*target{
		{name: "direct upstream", start: direct, path: "/payments", body: small},
		{name: "ReverseProxy", start: st.reverseProxy, path: "/payments", body: small},
		// The same server again: its ratio to the first is this run's noise.
		{name: "ReverseProxy again (noise)", start: st.reverseProxy, path: "/payments", body: small},
	}
	if nginxBin, err := exec.LookPath("nginx"); err == nil {
		targets = append(targets, &target{name: "nginx proxy_pass", start: func() (*proc, error) { return startNginx(nginxBin, dir, upAddr) }, path: "/payments", body: small})
	}
	targets = append(targets,
		&target{name: "idemproxy pass-through", start: idem, path: "/other", body: small},
		&target{name: floorName, start: st.floor, path: "/payments", body: small, keyed: true},
		&target{name: "idemproxy first attempts", start: idem, path: "/payments", body: small, keyed: true},
		&target{name: "idemproxy first attempts, log_level warn", start: st.idemproxy(bin, "warn", true), path: "/payments", body: small, keyed: true},
		&target{name: "idemproxy first attempts, store.pipeline off", start: st.idemproxy(bin, "info", false), path: "/payments", body: small, keyed: true},
		&target{name: "idemproxy replays", start: idem, path: "/payments", body: small, prepare: seed},
		// The floor's replay: one SET NX GET, the stored body written by
		// net/http. What a replay from Redis costs with nothing else.
		&target{name: replayFloorName, start: st.floor, path: "/payments", body: small, prepare: seed},
	)
	if prevBin != "" {
		// The previous release, same config, beside this tree (issue 45):
		// each release's table shows both from one run.
		prev := st.idemproxy(prevBin, "info", true)
		targets = append(targets,
			&target{name: "previous release " + prevVersion + ", pass-through", start: prev, path: "/other", body: small},
			&target{name: "previous release " + prevVersion + ", first attempts", start: prev, path: "/payments", body: small, keyed: true},
			&target{name: "previous release " + prevVersion + ", replays", start: prev, path: "/payments", body: small, prepare: seed},
		)
	}
	if fiberBin != "" {
		fiber := st.fiber(fiberBin, delay)
		targets = append(targets,
			&target{name: fiberName, start: fiber, path: "/payments", body: small, keyed: true},
			&target{name: "Fiber idempotency middleware, replays", start: fiber, path: "/payments", body: small, prepare: seed},
		)
	}
	targets = append(targets, st.grpcTargets(bin)...)
	body64k, body1m := bytes.Repeat([]byte("a"), 64<<10), bytes.Repeat([]byte("a"), 1<<20)
	return append(targets,
		&target{name: "ReverseProxy, 64 KiB body", start: st.reverseProxy, path: "/payments", body: body64k},
		&target{name: "idemproxy first attempts, 64 KiB body", start: idem, path: "/payments", body: body64k, keyed: true},
		&target{name: "ReverseProxy, 1 MiB body", start: st.reverseProxy, path: "/payments", body: body1m},
		&target{name: "idemproxy first attempts, 1 MiB body", start: idem, path: "/payments", body: body1m, keyed: true},
	)
}

// starters start the bench's servers, each its own process on loopback,
// in front of the upstream at upAddr (upURL) and on the Redis at
// redisAddr; dir holds their files, self is this binary.
type starters struct {
	dir, self, redisAddr, upAddr, upURL string
}

// reverseProxy starts a plain httputil.ReverseProxy.
func (st starters) reverseProxy() (*proc, error) {
	a := fmt.Sprintf("127.0.0.1:%d", freePort())
	return startProc("reverseproxy", a, st.self, "reverseproxy", "-listen", a, "-upstream", st.upURL)
}

// floor starts the floor: the ReverseProxy with one SET NX GET per
// keyed request.
func (st starters) floor() (*proc, error) {
	a := fmt.Sprintf("127.0.0.1:%d", freePort())
	return startProc("floor", a, st.self, "reverseproxy", "-listen", a, "-upstream", st.upURL, "-redis", st.redisAddr)
}

// idemproxy is a starter of bin (this tree's or the previous release's)
// at logLevel, with store.pipeline as given.
func (st starters) idemproxy(bin, logLevel string, pipeline bool) func() (*proc, error) {
	return func() (*proc, error) {
		port, admin := freePort(), freePort()
		a := fmt.Sprintf("127.0.0.1:%d", port)
		cfg := filepath.Join(st.dir, "idemproxy.yaml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, idemproxyConfig, a, admin, logLevel, st.upURL, pipeline, st.redisAddr), 0o644); err != nil {
			return nil, err
		}
		return startIdemproxy(bin, cfg, port, admin, nil)
	}
}

// fiber is a starter of the Fiber peer (its own upstream, delay per
// request).
func (st starters) fiber(fiberBin string, delay time.Duration) func() (*proc, error) {
	return func() (*proc, error) {
		a := fmt.Sprintf("127.0.0.1:%d", freePort())
		return startProc("fiber", a, fiberBin, "-listen", a, "-redis", st.redisAddr, "-delay", delay.String())
	}
}

// seeder is a target's prepare: it stores 1,000 keys (prefix-0...) with
// body, and returns them for replays.
func seeder(prefix string, body []byte) func(base string) ([]string, error) {
	return func(base string) ([]string, error) {
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s-%d", prefix, i)
			req, _ := http.NewRequest(http.MethodPost, base+"/payments", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Forwarded-User", "bench")
			req.Header.Set("Idempotency-Key", keys[i])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return keys, nil
	}
}

// pgTargets are idemproxy on the PostgreSQL store pg (first attempts and
// replays), its store CPU PostgreSQL's: the postmaster and its backends.
func pgTargets(dir, bin string, pg *pgtest.Server, upAddr string, delay time.Duration) []*target {
	small := []byte(`{"amount":1250,"currency":"EUR","customer":"cus_42","description":"order 42"}`)
	store := &proc{name: "postgres", pidOf: pg.PID, shared: true}
	startWith := func(defaults string) func() (*proc, error) {
		return func() (*proc, error) {
			port, admin := freePort(), freePort()
			a := fmt.Sprintf("127.0.0.1:%d", port)
			cfg := filepath.Join(dir, "idemproxy-pg.yaml")
			if err := os.WriteFile(cfg, fmt.Appendf(nil, pgConfig, a, admin, "http://"+upAddr, pg.URL, defaults), 0o644); err != nil {
				return nil, err
			}
			return startIdemproxy(bin, cfg, port, admin, nil)
		}
	}
	start := startWith("")
	seed := seeder(fmt.Sprintf("pg-replay-%d", delay), small)
	return []*target{
		{name: "idemproxy on PostgreSQL, first attempts", start: start, path: "/payments", body: small, keyed: true, store: store},
		{name: "idemproxy on PostgreSQL, replays", start: start, path: "/payments", body: small, prepare: seed, store: store},
		// The same with a first-sent time on every request (it reads the
		// epoch in the claim's transaction), and with a quota (counted
		// after the claims: issue 78).
		{name: "idemproxy on PostgreSQL, first attempts, first-sent", start: start, path: "/payments", body: small, keyed: true, store: store, firstSent: true},
		{name: "idemproxy on PostgreSQL, first attempts, quota.new_keys", start: startWith("  quota:\n    new_keys: 100000000\n    window: 1h\n"), path: "/payments", body: small, keyed: true, store: store},
	}
}

// rounds measures targets in o.rounds interleaved rounds and returns each
// target's median.
func rounds(o options, targets []*target, delay time.Duration, redisProc *proc, seq *atomic.Int64) ([]result, error) {
	// Rounds interleave the targets, so a slow minute on a shared
	// machine hits every target instead of one; after the first round
	// the order is shuffled, so no target always follows the same one.
	runs := make(map[string][]result)
	var chosen []*target
	for _, t := range targets {
		if selected(o.only, t.name) {
			chosen = append(chosen, t)
		}
	}
	for round := range o.rounds {
		order := slices.Clone(chosen)
		if round > 0 {
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		for _, t := range order {
			r, err := measure(o, t, delay, redisProc, seq)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(os.Stderr, "round %d/%d  %-44s %5s upstream: %8.0f rps  p50 %6s  p99 %6s\n", round+1, o.rounds, r.name, delay, r.rps, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond))
			runs[t.name] = append(runs[t.name], r)
		}
	}
	var results []result
	for _, t := range targets {
		if rs := runs[t.name]; len(rs) > 0 {
			results = append(results, median(rs))
		}
	}
	return results, nil
}

// selected reports whether name is among the comma-separated names in
// only (exact match), or only is empty.
func selected(only, name string) bool {
	if only == "" {
		return true
	}
	// Names are separated by "," without a space after it: several target
	// names contain ", " themselves ("ReverseProxy, 64 KiB body").
	var names []string
	for n := range strings.SplitSeq(only, ",") {
		if strings.HasPrefix(n, " ") && len(names) > 0 {
			names[len(names)-1] += "," + n
			continue
		}
		names = append(names, n)
	}
	return slices.Contains(names, name)
}
