package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/proxy"
)

func TestCheckFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"-config", "config.example.yaml", "-check"}, &out, &errOut); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if !strings.Contains(out.String(), "valid, 3 routes") {
		t.Errorf("output %q", out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("defaults:\n  lease: banana\nroutes:\n  - name: a\n    match: \"POST /a\"\n  - name: a\n    match: \"POST /b\"\n"), 0o600)
	err := run(context.Background(), []string{"-config", bad, "-check"}, &out, &errOut)
	if err == nil {
		t.Fatal("invalid config passed -check")
	}
	for _, want := range []string{"defaults.lease: must be a duration", `routes[1].name: duplicate route name "a"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("-check error %q does not report %q", err, want)
		}
	}
}

func TestDemoShowsTheGuarantees(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"demo", "-once"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"1 x 201, 19 x 409",
		"201, Idempotent-Replayed: true, byte-identical body",
		"422 key-reused",
		"503 released, retry 201 executed",
		"1 x 201, 9 x 201 replayed; 1 distinct success body",
		"400 key-missing",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q:\n%s", want, text)
		}
	}
}

// TestDrainStoresInFlightRequest cancels serve (as SIGTERM does) while a
// protected request is upstream: the request completes and its response is
// stored before serve returns.
func TestDrainStoresInFlightRequest(t *testing.T) {
	srv := redistest.Start(t)
	var arrived atomic.Bool
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Store(true)
		time.Sleep(500 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	defer upstream.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream.URL
	cfg.Upstream.Timeout = 5 * time.Second
	cfg.Store.Redis.Addrs = []string{srv.Addr}
	cfg.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}}

	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	addr := s.clientAddr
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader("{}"))
		req.Header.Set("X-Forwarded-User", "alice")
		req.Header.Set("Idempotency-Key", "drain-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{status: resp.StatusCode, body: string(b)}
	}()
	for !arrived.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // SIGTERM
	r := <-done
	if r.err != nil || r.status != http.StatusCreated || r.body != "charged" {
		t.Fatalf("in-flight request during drain: %d %q %v", r.status, r.body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("serve: %v", err)
	}
	store := claim.New(srv.Client(), cfg.Store.KeyPrefix)
	rec, _, err := store.Get(context.Background(), store.Key("alice", proxy.KeyScope("pay", false), "drain-1"))
	if err != nil || rec == nil || rec.State != claim.Completed || string(rec.Body) != "charged" {
		t.Fatalf("stored record after drain: %+v, %v", rec, err)
	}
}

func TestVersionFlag(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-version"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "idemproxy ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("-version printed %q", out.String())
	}
}

// TestPasswordFile: the Redis password comes from a mounted file; with the
// right one the store is up, with a wrong one idemproxy_store_up says so.
func TestPasswordFile(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	for _, tc := range []struct {
		password string
		up       bool
	}{{"s3cret\n", true}, {"wrong", false}} {
		file := filepath.Join(t.TempDir(), "password")
		os.WriteFile(file, []byte(tc.password), 0o600)
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Store.Redis = config.Redis{Addrs: []string{srv.Addr}, PasswordFile: file}
		if got := storeUpOnce(t, cfg); got != tc.up {
			t.Errorf("password %q: store up %t, want %t", tc.password, got, tc.up)
		}
	}
}

// TestSentinelPasswordFile: sentinels with their own password, read from a
// mounted file; with the right one the store is up, with a wrong one
// idemproxy_store_up says so.
func TestSentinelPasswordFile(t *testing.T) {
	topo := redistest.StartSentinelAuth(t, 1, "data-pw", "sentinel-pw")
	for _, tc := range []struct {
		password string
		up       bool
	}{{"sentinel-pw\n", true}, {"wrong", false}} {
		file := filepath.Join(t.TempDir(), "sentinel-password")
		os.WriteFile(file, []byte(tc.password), 0o600)
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Store.Redis = config.Redis{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName, Password: "data-pw", SentinelPasswordFile: file}
		if got := storeUpOnce(t, cfg); got != tc.up {
			t.Errorf("sentinel password %q: store up %t, want %t", tc.password, got, tc.up)
		}
	}
}

// storeUpOnce serves cfg until the store watcher has looked at Redis once,
// stops and returns whether it found it up (idemproxy_store_up). /readyz
// answers 200 either way: readiness is the sidecar's own.
func storeUpOnce(t *testing.T, cfg *config.Config) bool {
	t.Helper()
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	var up bool
	poll.Until(t, "the store watcher's first look", func() bool {
		var seen bool
		seen, up = storeUp(t, "http://"+s.adminAddr)
		return seen
	})
	resp, err := http.Get("http://" + s.adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz %d with the store up=%t, want 200: readiness is not tied to the store", resp.StatusCode, up)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return up
}

// storeUp reads idemproxy_store_up from admin's /metrics: whether any
// series is there yet, and whether every master is up.
func storeUp(t *testing.T, admin string) (seen, up bool) {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	up = true
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "idemproxy_store_up{"); ok {
			seen = true
			up = up && strings.HasSuffix(rest, "} 1")
		}
	}
	return seen, seen && up
}

// startTest starts idemproxy for cfg, reloading from path when it is set,
// and stops it when the test ends. stop cancels it, as SIGTERM does, and
// returns what wait returned once the drain is over.
func startTest(t *testing.T, cfg *config.Config, path string, logger *slog.Logger) (s *server, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := start(ctx, cfg, path, logger)
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.wait(ctx) }()
	var once sync.Once
	var waitErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			waitErr = <-done
		})
		return waitErr
	}
	t.Cleanup(func() { stop() })
	return s, stop
}

// pay sends one protected POST and returns its status and body.
func pay(t *testing.T, addr, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader("{}"))
	req.Header.Set("X-Forwarded-User", "alice")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /payments: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func lateConfig(srv *redistest.Server, upstream string) *config.Config {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream
	cfg.Upstream.Timeout = time.Second
	cfg.Store.Redis.Addrs = []string{srv.Addr}
	cfg.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}}
	return cfg
}

// TestDrainStoresLateAnswer: SIGTERM while a call runs past
// upstream.timeout (its client already got 504) waits for it, within
// drain.timeout, and stores its late answer before serve returns.
func TestDrainStoresLateAnswer(t *testing.T) {
	srv := redistest.Start(t)
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged late")
	}))
	defer upstream.Close()
	cfg := lateConfig(srv, upstream.URL)
	cfg.Drain.Timeout = 10 * time.Second
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	addr := s.clientAddr
	if status, body := pay(t, addr, "late-1"); status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d %s, want 504", status, body)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // SIGTERM
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("serve returned (%v) while a late call was running", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("serve: %v", err)
	}
	store := claim.New(srv.Client(), cfg.Store.KeyPrefix)
	rec, _, err := store.Get(context.Background(), store.Key("alice", proxy.KeyScope("pay", false), "late-1"))
	if err != nil || rec == nil || rec.State != claim.Completed || string(rec.Body) != "charged late" {
		t.Fatalf("stored record after drain: %+v, %v; want the late answer", rec, err)
	}
}

// TestDrainTimeoutSettlesLateCalls: a late call still running when
// drain.timeout runs out is cancelled and settled by unknown_outcome (fail:
// a stored outcome-unknown), not left in progress by the exit.
func TestDrainTimeoutSettlesLateCalls(t *testing.T) {
	srv := redistest.Start(t)
	var cancelled atomic.Bool
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // net/http watches for a closed connection only after the body
		<-r.Context().Done()
		cancelled.Store(true)
	}))
	defer upstream.Close()
	cfg := lateConfig(srv, upstream.URL)
	cfg.Drain.Timeout = 500 * time.Millisecond
	cfg.Routes[0].Settings.UnknownOutcome = config.OutcomeFail
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	addr := s.clientAddr
	if status, body := pay(t, addr, "late-2"); status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d %s, want 504", status, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	store := claim.New(srv.Client(), cfg.Store.KeyPrefix)
	rec, _, err := store.Get(context.Background(), store.Key("alice", proxy.KeyScope("pay", false), "late-2"))
	if err != nil || rec == nil || rec.State != claim.Completed || rec.Status != http.StatusBadGateway || !strings.Contains(string(rec.Body), "outcome-unknown") {
		t.Fatalf("record after the drain ran out: %+v, %v; want a stored 502 outcome-unknown", rec, err)
	}
	poll.Until(t, "the upstream call is cancelled", cancelled.Load)
}

// TestPprofOnlyOnItsOwnLoopbackListener: pprof is never served next to the
// probes on the admin port, only on admin_pprof_listen.
func TestPprofOnlyOnItsOwnLoopbackListener(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen, cfg.AdminPprofListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	get := func(addr string) int {
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(s.adminAddr); got != http.StatusNotFound {
		t.Errorf("pprof on the admin port: %d, want 404", got)
	}
	if s.pprofAddr == "" || get(s.pprofAddr) != http.StatusOK {
		t.Errorf("pprof on admin_pprof_listen (%q): not served", s.pprofAddr)
	}
}

// TestSealingOptions: key files are base64 of 32 bytes; a bad one is
// refused at start, named by its key.
func TestSealingOptions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o400)
		return p
	}
	good := write("good", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n") // 32 bytes
	short := write("short", "c2hvcnQ=")
	notB64 := write("bad", "not base64!")
	for _, tc := range []struct {
		files []string
		want  string
	}{
		{[]string{good}, ""},
		{[]string{good, short}, "store.encryption.key_files[1]"},
		{[]string{notB64}, "store.encryption.key_files[0]"},
		{[]string{filepath.Join(dir, "missing")}, "store.encryption.key_files[0]"},
	} {
		var st config.Store
		st.Encryption.KeyFiles = tc.files
		opts, err := sealingOptions(st)
		switch {
		case tc.want == "" && (err != nil || len(opts) != 1):
			t.Errorf("%v: %v, %d options; want one", tc.files, err, len(opts))
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error naming %s", tc.files, err, tc.want)
		}
	}
}

// TestStoreFullKeepsRoomForCompletions: once Redis is above
// store.claim_memory_limit, new claims get 503 store-full and nothing is
// forwarded, while a request already in flight still stores its answer and
// is replayed (issue 13: another principal filling Redis must not turn an
// in-flight payment into a retry that executes again).
func TestStoreFullKeepsRoomForCompletions(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	release := make(chan struct{})
	var arrived, calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Idempotency-Key") == "inflight" {
			arrived.Add(1)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged "+r.Header.Get("Idempotency-Key"))
	}))
	defer upstream.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	cfg := lateConfig(srv, upstream.URL)
	cfg.Upstream.Timeout = 30 * time.Second
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	type result struct {
		status int
		body   string
	}
	inflight := make(chan result, 1)
	go func() {
		st, b := pay(t, s.clientAddr, "inflight")
		inflight <- result{st, b}
	}()
	poll.Until(t, "the in-flight request reaches the upstream", func() bool { return arrived.Load() == 1 })

	rdb := srv.Client()
	ctx := context.Background()
	filler := strings.Repeat("x", 100<<10)
	for i := 0; ; i++ {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		var used, limit float64
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				used, _ = strconv.ParseFloat(v, 64)
			}
			if v, ok := strings.CutPrefix(line, "maxmemory:"); ok {
				limit, _ = strconv.ParseFloat(v, 64)
			}
		}
		if used/limit >= 0.93 {
			break
		}
		if i > 200 {
			t.Fatalf("could not fill Redis: %.0f of %.0f bytes", used, limit)
		}
		if err := rdb.Set(ctx, fmt.Sprintf("filler:%d", i), filler, 0).Err(); err != nil {
			t.Fatalf("fill: %v", err)
		}
	}
	n := 0
	poll.Until(t, "new claims are refused with 503 store-full", func() bool {
		n++
		status, body := pay(t, s.clientAddr, fmt.Sprintf("fresh-%d", n))
		return status == http.StatusServiceUnavailable && strings.Contains(body, "store-full")
	})
	before := calls.Load()
	if status, body := pay(t, s.clientAddr, "fresh-again"); status != http.StatusServiceUnavailable || calls.Load() != before {
		t.Fatalf("a new claim while full: %d %s, forwarded %d; want 503 store-full and nothing forwarded", status, body, calls.Load()-before)
	}
	close(release)
	if r := <-inflight; r.status != http.StatusCreated || r.body != "charged inflight" {
		t.Fatalf("the in-flight request: %d %q, want its 201", r.status, r.body)
	}
	if status, body := pay(t, s.clientAddr, "inflight"); status != http.StatusCreated || body != "charged inflight" {
		t.Fatalf("its retry while full: %d %q, want the stored answer replayed", status, body)
	}
	if got := arrived.Load(); got != 1 {
		t.Fatalf("the in-flight request executed %d times, want 1", got)
	}
}

// TestKeysAPI: /v1/keys on the admin port needs the bearer token, looks a
// key up without its body unless asked, and deletes only in the state the
// caller names; the CLI reaches it too.
func TestKeysAPI(t *testing.T) {
	srv := redistest.Start(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	defer upstream.Close()
	cfg := lateConfig(srv, upstream.URL)
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("0123456789abcdef-admin\n"), 0o400)
	cfg.Admin.TokenFile = tokenFile
	logs := &syncbuf.Buffer{}
	s, _ := startTest(t, cfg, "", slog.New(slog.NewJSONHandler(logs, nil)))
	if status, _ := pay(t, s.clientAddr, "k1"); status != http.StatusCreated {
		t.Fatal(status)
	}
	call := func(method, query, token string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+s.adminAddr+"/v1/keys?"+query, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const q = "route=pay&principal=alice&key=k1"
	for _, token := range []string{"", "wrong-token-wrong-token"} {
		if status, _ := call(http.MethodGet, q, token); status != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", token, status)
		}
	}
	const token = "0123456789abcdef-admin"
	status, body := call(http.MethodGet, q, token)
	if status != http.StatusOK || !strings.Contains(body, `"state":"completed"`) || !strings.Contains(body, `"status":201`) || strings.Contains(body, "charged") {
		t.Fatalf("GET: %d %s, want completed 201 without the body", status, body)
	}
	if _, body := call(http.MethodGet, q+"&body=true", token); !strings.Contains(body, `"body":"charged"`) {
		t.Errorf("GET with body=true: %s", body)
	}
	if status, _ := call(http.MethodDelete, q, token); status != http.StatusBadRequest {
		t.Errorf("DELETE without a state: %d, want 400", status)
	}
	if status, _ := call(http.MethodDelete, q+"&state=in_progress", token); status != http.StatusConflict {
		t.Errorf("DELETE state=in_progress of a completed key: %d, want 409 (left alone)", status)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "delete", "-admin", "http://" + s.adminAddr, "-token-file", tokenFile,
		"-route", "pay", "-principal", "alice", "-key", "k1", "-state", "completed"}, &out, io.Discard); err != nil {
		t.Fatalf("idemproxy keys delete: %v (%s)", err, out.String())
	}
	if _, body := call(http.MethodGet, q, token); !strings.Contains(body, `"state":"absent"`) {
		t.Errorf("GET after the delete: %s", body)
	}
	if audit := strings.Count(logs.String(), `"msg":"admin key API"`); audit != 6 || strings.Count(logs.String(), "refused, bad or missing token") != 2 || strings.Contains(logs.String(), "k1\"") {
		t.Errorf("%d audit lines, want one per authorized call (6), two refusals, and never the raw key:\n%s", audit, logs.String())
	}
}

// The store's and the waiters' metrics are on /metrics: pipelines sent
// (each store operation went in one) and retries waiting now.
func TestStoreAndWaiterMetrics(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	defer upstream.Close()
	cfg := lateConfig(redistest.Start(t), upstream.URL)
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	if status, _ := pay(t, s.clientAddr, "k1"); status != http.StatusCreated {
		t.Fatalf("first attempt: %d", status)
	}
	resp, err := http.Get("http://" + s.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"idemproxy_waiting_retries 0", "idemproxy_store_pipeline_operations_count "} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), "idemproxy_store_pipeline_operations_count 0\n") {
		t.Error("no store pipeline was counted for a claim and a completion")
	}
}
