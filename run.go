package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/proxy"
)

// Server limits on the client port. Headers are small for a JSON API; a
// slow client cannot hold a connection open forever.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 120 * time.Second
	maxHeaderBytes    = 64 << 10
	// abandonWait bounds how long the calls a drain cancelled take to
	// settle: a few store round trips each, retried as any settle is.
	abandonWait = 10 * time.Second
)

// run is the whole program: it parses args, and either checks a config,
// runs the demo, or serves until ctx is cancelled and in-flight requests
// have settled.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "demo" {
		return runDemo(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "config.yaml", "path of the YAML config file")
	check := fs.Bool("check", false, "validate the config file and exit")
	version := fs.Bool("version", false, "print build information and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		fmt.Fprintln(stdout, buildInfo())
		return nil
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return fmt.Errorf("invalid config %s:\n%w", *path, err)
	}
	if *check {
		fmt.Fprintf(stdout, "%s: valid, %d routes\n", *path, len(cfg.Routes))
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stdout, "warning: %s\n", w)
		}
		return nil
	}
	// serve filters by log_level; the handler passes everything it is given.
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return serve(ctx, cfg, *path, logger, nil)
}

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version from the build info is used.
var version = ""

func buildInfo() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "idemproxy " + version
	}
	v := version
	if v == "" {
		v = bi.Main.Version
	}
	s := fmt.Sprintf("idemproxy %s %s", v, bi.GoVersion)
	for _, kv := range bi.Settings {
		if kv.Key == "vcs.revision" || kv.Key == "vcs.time" || kv.Key == "vcs.modified" {
			s += " " + kv.Key + "=" + kv.Value
		}
	}
	return s
}

// serve wires the store, metrics and handler and serves until ctx ends.
// With a non-empty path, routes reload when that file changes and on
// SIGHUP. When ready is not nil it receives the client and admin addresses
// once both listeners are open.
func serve(ctx context.Context, cfg *config.Config, path string, logger *slog.Logger, ready func(client, admin string)) error {
	level := new(slog.LevelVar)
	level.Set(cfg.SlogLevel())
	logger = slog.New(leveled{next: logger.Handler(), level: level})
	// go-redis has one process-wide logger; route it into ours.
	redis.SetLogger(claim.SlogLogger{Logger: logger})

	for _, w := range cfg.Warnings() {
		logger.Warn(w)
	}
	redisCfg := cfg.Store.Redis
	embedded := len(redisCfg.Addrs) == 0
	if embedded {
		emb, err := claim.StartEmbedded()
		if err != nil {
			return fmt.Errorf("start embedded store: %w", err)
		}
		defer emb.Close()
		logger.Warn("USING THE EMBEDDED IN-MEMORY STORE: single instance, not durable, for development only; set store.redis.addrs in production",
			"addr", emb.Addr())
		redisCfg = config.Redis{Addrs: []string{emb.Addr()}}
	}
	for _, secret := range []struct {
		key, file string
		dst       *string
	}{
		{"store.redis.password_file", redisCfg.PasswordFile, &redisCfg.Password},
		{"store.redis.sentinel_password_file", redisCfg.SentinelPasswordFile, &redisCfg.SentinelPassword},
	} {
		if secret.file == "" {
			continue
		}
		b, err := os.ReadFile(secret.file)
		if err != nil {
			return fmt.Errorf("%s: %w", secret.key, err)
		}
		*secret.dst = strings.TrimSpace(string(b))
	}
	client, err := claim.NewClient(redisCfg)
	if err != nil {
		return err
	}
	defer client.Close()

	reg := prometheus.NewRegistry()
	waitShort := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_store_wait_short_total",
		Help: "Claims and completions that fewer than store.wait_replicas replicas acknowledged within store.wait_timeout, by op.",
	}, []string{"op"})
	reg.MustRegister(waitShort)
	var opts []claim.Option
	if cfg.Store.WaitReplicas > 0 {
		waitShort.WithLabelValues("claim")
		waitShort.WithLabelValues("complete")
		opts = append(opts, claim.WithWait(cfg.Store.WaitReplicas, cfg.Store.WaitTimeout, func(op string) {
			waitShort.WithLabelValues(op).Inc()
		}))
	}
	store := claim.New(client, cfg.Store.KeyPrefix, opts...)

	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	evictionSafe := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_redis_eviction_policy_safe",
		Help: "1 when Redis' maxmemory-policy is noeviction, 0 when it can evict idempotency keys, -1 when unknown.",
	})
	reg.MustRegister(evictionSafe)
	preload(ctx, store, logger)
	if embedded {
		evictionSafe.Set(1) // the embedded store has no memory limit and never evicts
	} else {
		go watchEviction(ctx, store, logger, evictionSafe)
	}

	h, err := proxy.New(cfg, store, proxy.Options{Logger: logger, Metrics: proxy.NewMetrics(reg)})
	if err != nil {
		return err
	}
	if path != "" {
		rl := newReloader(path, cfg, h, level, logger, reg)
		go rl.run(ctx)
	}

	var draining atomic.Bool
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if cfg.AdminPprof {
		admin.HandleFunc("/debug/pprof/", pprof.Index)
		admin.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		admin.HandleFunc("/debug/pprof/profile", pprof.Profile)
		admin.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		admin.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	admin.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		pctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := store.Ping(pctx); err != nil {
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})

	clientLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		clientLn.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	adminSrv := &http.Server{Handler: admin, ReadHeaderTimeout: readHeaderTimeout}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(clientLn) }()
	go func() { errc <- adminSrv.Serve(adminLn) }()
	logger.Info("serving", "listen", clientLn.Addr().String(), "admin_listen", adminLn.Addr().String(),
		"upstream", cfg.Upstream.URL, "routes", len(cfg.Routes))
	if ready != nil {
		ready(clientLn.Addr().String(), adminLn.Addr().String())
	}

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Drain: fail readiness, wait for load balancers to notice, stop
	// accepting, let in-flight requests settle and store, then exit.
	draining.Store(true)
	grace := cfg.Grace()
	logger.Info("draining", "delay", cfg.Drain.Delay.String(), "timeout", grace.String())
	time.Sleep(cfg.Drain.Delay)
	err = drain(srv, h, grace, logger)
	actx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = adminSrv.Shutdown(actx)
	if err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// drain stops srv accepting and waits up to grace for the requests in
// flight, late upstream calls included, to settle and store. Calls still
// running then are cancelled and settled by their routes' unknown_outcome,
// rather than left to the dual-write window by the exit.
func drain(srv *http.Server, h *proxy.Handler, grace time.Duration, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		n := h.Abandon()
		logger.Error("drain.timeout ran out with requests in flight: cancelling their upstream calls; each key is settled by its route's unknown_outcome",
			"timeout", grace.String(), "upstream_calls", n)
		actx, acancel := context.WithTimeout(context.Background(), abandonWait)
		defer acancel()
		err = srv.Shutdown(actx)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("drain: %w", err)
	}
	return nil
}

// preload loads the scripts. A failure does not stop the start: Redis may
// come up later, and /readyz reports it until then.
func preload(ctx context.Context, store *claim.Store, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := store.Preload(ctx); err != nil {
		logger.Warn("store not reachable at start", "err", err)
	}
}

// evictionCheckInterval is how often Redis' eviction policy is re-read: an
// operator may change it at run time with CONFIG SET.
const evictionCheckInterval = 5 * time.Minute

// watchEviction warns loudly, at start and then periodically, when Redis
// can evict idempotency keys, and keeps the gauge current.
func watchEviction(ctx context.Context, store *claim.Store, logger *slog.Logger, safe prometheus.Gauge) {
	t := time.NewTicker(evictionCheckInterval)
	defer t.Stop()
	for {
		checkEviction(ctx, store, logger, safe)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func checkEviction(ctx context.Context, store *claim.Store, logger *slog.Logger, safe prometheus.Gauge) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	policy, err := store.EvictionPolicy(ctx)
	switch {
	case err != nil:
		safe.Set(-1)
		logger.Warn("cannot read Redis maxmemory-policy", "err", err)
	case policy != "noeviction":
		safe.Set(0)
		logger.Error("REDIS CAN EVICT IDEMPOTENCY KEYS: maxmemory-policy is not noeviction; an evicted claim lets a retry execute again",
			"maxmemory_policy", policy)
	default:
		safe.Set(1)
	}
}

// leveled filters a handler by a level that a reload can change.
type leveled struct {
	next  slog.Handler
	level *slog.LevelVar
}

func (h leveled) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level.Level() && h.next.Enabled(ctx, l)
}

func (h leveled) Handle(ctx context.Context, r slog.Record) error { return h.next.Handle(ctx, r) }

func (h leveled) WithAttrs(as []slog.Attr) slog.Handler {
	return leveled{next: h.next.WithAttrs(as), level: h.level}
}

func (h leveled) WithGroup(name string) slog.Handler {
	return leveled{next: h.next.WithGroup(name), level: h.level}
}
