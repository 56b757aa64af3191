package proxy_test

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/proxy"
)

// env is a proxy between a real httptest upstream and a real redis-server.
type env struct {
	t testing.TB
	// redis is the redis-server under the store; nil on the embedded
	// store or a multi-node topology.
	redis *redistest.Server
	// rdb is a client of the store, for looking at Redis directly.
	rdb      redis.UniversalClient
	store    *redisstore.Store
	upstream *httptest.Server
	ledger   *ledger
	front    *httptest.Server
	reg      *prometheus.Registry
	// prefix is the store's key prefix.
	prefix string
	// h is the handler under test.
	h *proxy.Handler
	// logs holds the proxy's JSON log lines.
	logs *syncbuf.Buffer
	// active counts handler calls still running: a client can read its
	// answer a moment before the handler returns and counts it.
	active atomic.Int64
	// waitShort counts WAITs that fewer replicas acknowledged than asked.
	waitShort atomic.Int64
}

// quiesce waits until no handler call is running, so metrics and logs
// cover every request the test has seen answered.
func (e *env) quiesce() {
	e.t.Helper()
	poll.Until(e.t, "every handler call returned", func() bool { return e.active.Load() == 0 })
}

// ledger counts upstream executions per idempotency key, as a legacy
// payments app would charge.
type ledger struct {
	mu    sync.Mutex
	calls map[string]int
	seen  []http.Header
}

func (l *ledger) record(r *http.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == nil {
		l.calls = map[string]int{}
	}
	l.calls[r.Header.Get("Idempotency-Key")]++
	l.seen = append(l.seen, r.Header.Clone())
}

func (l *ledger) total() int {
	n := 0
	for _, c := range l.calls {
		n += c
	}
	return n
}

// Total is every execution so far.
func (l *ledger) Total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total()
}

// Last returns the headers of the last request the upstream saw.
func (l *ledger) Last() http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.seen) == 0 {
		return nil
	}
	return l.seen[len(l.seen)-1]
}

// route returns a route named after its pattern with default settings.
func route(name, match string) proxy.Route { return proxy.TestRoute(name, match) }

// setup is what a test may adjust before the proxy starts: its config and
// the store's WAIT for replicas.
type setup struct {
	proxy.Config
	WaitReplicas int
	WaitTimeout  time.Duration
	// StoreOptions are passed to redisstore.New (sealing, key secret).
	StoreOptions []claim.Option
	// WaitSafetyPoll is proxy.Options.WaitSafetyPoll.
	WaitSafetyPoll time.Duration
	// TracerProvider is proxy.Options.TracerProvider.
	TracerProvider trace.TracerProvider
	// HTTP2 serves the proxy over TLS with HTTP/2 (front.Client speaks it).
	HTTP2 bool
	// Transport is proxy.Options.Transport.
	Transport http.RoundTripper
	// WrapStore, when set, is the store the handler gets, around the
	// env's (a test's faults).
	WrapStore func(proxy.Store) proxy.Store
}

// newEnv starts a store, the upstream (app sees every request after the
// ledger recorded it) and the proxy. mutate adjusts the config. The store
// is a real redis-server when one is installed (or required), else the
// embedded store, which passes the same contract suite: the flow tests
// then still run on a machine without Redis.
func newEnv(t testing.TB, app http.HandlerFunc, mutate func(*setup)) *env {
	t.Helper()
	if redistest.Available() {
		return newEnvOn(t, redistest.Start(t), app, mutate)
	}
	t.Logf("redis-server not found: running on the embedded store (set %s=1 to require Redis)", redistest.RequireEnv)
	emb, err := redisstore.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Close)
	return newEnvStore(t, nil, redisstore.ClientOptions{Addrs: []string{emb.Addr()}}, app, mutate)
}

// newEnvOn is newEnv on a given redis-server.
func newEnvOn(t testing.TB, srv *redistest.Server, app http.HandlerFunc, mutate func(*setup)) *env {
	t.Helper()
	return newEnvStore(t, srv, redisstore.ClientOptions{Addrs: []string{srv.Addr}}, app, mutate)
}

// newEnvStore is newEnv on any Redis deployment (Cluster, Sentinel); srv
// may be nil when there is no single server.
func newEnvStore(t testing.TB, srv *redistest.Server, store redisstore.ClientOptions, app http.HandlerFunc, mutate func(*setup)) *env {
	t.Helper()
	e := &env{t: t, ledger: &ledger{}, redis: srv, reg: prometheus.NewRegistry(), logs: &syncbuf.Buffer{}}
	e.upstream = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		e.ledger.record(r)
		app(w, r)
	}))
	t.Cleanup(e.upstream.Close)

	cfg := &setup{Config: proxy.TestConfig(e.upstream.URL), WaitTimeout: 100 * time.Millisecond}
	cfg.UpstreamTimeout = 5 * time.Second
	cfg.Routes = []proxy.Route{route("pay", "POST /payments")}
	if mutate != nil {
		mutate(cfg)
	}
	e.prefix = "idem:"
	client, err := redisstore.NewClient(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	e.rdb = client
	opts := cfg.StoreOptions
	if cfg.WaitReplicas > 0 {
		opts = append(opts, claim.WithWait(cfg.WaitReplicas, cfg.WaitTimeout, func(op string) { e.waitShort.Add(1) }))
	}
	e.store = redisstore.New(client, e.prefix, opts...)
	t.Cleanup(e.store.Close)
	var out io.Writer = e.logs
	if os.Getenv("IDEMPROXY_TEST_LOG") == "1" {
		out = io.MultiWriter(e.logs, os.Stderr)
	}
	logger := slog.New(slog.NewJSONHandler(out, nil))
	// Short, for the slow-loris test; no other test trickles its body.
	cfg.Config.BodyReadTimeout = cmp.Or(cfg.Config.BodyReadTimeout, 500*time.Millisecond)
	var handlerStore proxy.Store = e.store
	if cfg.WrapStore != nil {
		handlerStore = cfg.WrapStore(handlerStore)
	}
	h, err := proxy.New(cfg.Config, handlerStore, proxy.Options{
		Logger:         logger,
		Metrics:        proxy.NewMetrics(e.reg),
		WaitSafetyPoll: cfg.WaitSafetyPoll,
		TracerProvider: cfg.TracerProvider,
		Transport:      cfg.Transport,
		Version:        "v9.9.9-test",
	})
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	e.front = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.active.Add(1)
		defer e.active.Add(-1)
		h.ServeHTTP(w, r)
	}))
	e.front.Config.MaxHeaderBytes = 64 << 10 // as run.go sets it
	if cfg.HTTP2 {
		e.front.EnableHTTP2 = true
		e.front.StartTLS()
	} else {
		e.front.Start()
	}
	t.Cleanup(e.front.Close)
	return e
}

// untrusted makes every peer untrusted: loopback test clients then count
// as outsiders.
func untrusted(c *setup) {
	c.Identity.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
}

// resp is a response with its body read.
type resp struct {
	status int
	header http.Header
	body   string
}

// req describes a client request; zero fields are left out.
type req struct {
	method, path, user, key, body string
	header                        map[string]string
}

// probeFingerprint sends alice's {} to the route "pay" under the key
// "probe" (one execution) and returns the fingerprint stored for it: that
// of every such request, whatever its key.
func (e *env) probeFingerprint() claim.Fingerprint {
	e.t.Helper()
	if first := e.do(req{user: "alice", key: "probe", body: `{}`}); first.status != http.StatusCreated {
		e.t.Fatal(first.status)
	}
	probe, _, err := e.store.Get(context.Background(), e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "probe"))
	if err != nil || probe == nil {
		e.t.Fatal(err)
	}
	return probe.Fingerprint
}

func (e *env) do(r req) resp {
	e.t.Helper()
	got, err := e.try(context.Background(), r)
	if err != nil {
		e.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	return got
}

func (e *env) try(ctx context.Context, r req) (resp, error) {
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/payments"
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, e.front.URL+r.path, strings.NewReader(r.body))
	if err != nil {
		return resp{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if r.user != "" {
		hr.Header.Set("X-Forwarded-User", r.user)
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	hresp, err := e.front.Client().Do(hr)
	if err != nil {
		return resp{}, err
	}
	defer hresp.Body.Close()
	b, err := io.ReadAll(hresp.Body)
	return resp{status: hresp.StatusCode, header: hresp.Header, body: string(b)}, err
}

// outcomes returns idemproxy_requests_total by outcome, all routes.
func (e *env) outcomes() map[string]float64 {
	e.t.Helper()
	e.quiesce()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "idemproxy_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// created answers 201 with a body naming the execution, like a charge.
func created(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Charge-Id", "ch_"+r.Header.Get("Idempotency-Key"))
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"charged_to":"`+r.Header.Get("X-Forwarded-User")+`","at":"`+time.Now().Format(time.RFC3339Nano)+`"}`)
}

// slow wraps h with a delay, so concurrent retries overlap the first one.
func slow(d time.Duration, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		h(w, r)
	}
}
