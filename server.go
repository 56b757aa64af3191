package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/claim/redisstore"
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

// server is one running idemproxy: its store, handler and listeners. start
// opens it and serves in the background; wait blocks until the context
// ends, then drains and closes it.
type server struct {
	cfg     *config.Config
	log     *slog.Logger
	level   *slog.LevelVar
	metrics *metrics
	store   claim.Backend
	handler *proxy.Handler
	// client and admin serve on clientAddr and adminAddr, where their
	// listeners are bound.
	client, admin         *http.Server
	clientAddr, adminAddr string
	// adminToken, when set, enables the key API on the admin port.
	adminToken []byte
	// pprofAddr is where pprof listens; empty when it does not.
	pprofAddr string
	// embedded is set when the store is the in-process one.
	embedded bool
	// health is what the store watcher last saw of Redis.
	health storeHealth
	// app probes the app's health path (/app/readyz).
	app *appHealth
	// errc receives the first listener that stops serving.
	errc     chan error
	draining atomic.Bool
	// schemaSeen is set once the store's scripts or schema were in place
	// (preload): until then the sidecar is not ready.
	schemaSeen atomic.Bool
	// closers release what start opened, run last to first by close.
	closers []func()
}

// serve runs idemproxy for cfg until ctx ends and in-flight requests have
// settled. With a non-empty path, routes reload when that file changes and
// on SIGHUP.
func serve(ctx context.Context, cfg *config.Config, path string, logger *slog.Logger) error {
	s, err := start(ctx, cfg, path, logger)
	if err != nil {
		return err
	}
	return s.wait(ctx)
}

// start wires the store, metrics and handler, opens both listeners and
// serves on them in the background. Every error on the way names the YAML
// path or address at fault; an unreachable Redis is not one: the sidecar
// serves, stays ready and answers protected routes per store_unavailable
// until Redis answers.
func start(ctx context.Context, cfg *config.Config, path string, logger *slog.Logger) (*server, error) {
	s := &server{cfg: cfg, level: new(slog.LevelVar), errc: make(chan error, 2)}
	if err := s.open(ctx, path, logger); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// open does start's work; on error, close releases what it opened.
func (s *server) open(ctx context.Context, path string, logger *slog.Logger) error {
	cfg := s.cfg
	s.level.Set(cfg.SlogLevel())
	s.log = slog.New(leveled{next: logger.Handler(), level: s.level})
	// go-redis has one process-wide logger; route it into ours.
	redis.SetLogger(redisstore.NewSlogLogger(s.log))
	sec, err := readSecrets(cfg)
	if err != nil {
		return err
	}
	s.adminToken = sec.adminToken
	for _, w := range cfg.Warnings() {
		s.log.Warn(w)
	}
	s.metrics = newMetrics(cfg.Store.WaitReplicas > 0)
	if err := s.openStore(ctx, sec); err != nil {
		return err
	}
	pcfg, err := proxyConfig(cfg, sec.webhooks)
	if err != nil {
		return err
	}
	opts, err := s.proxyOptions(ctx)
	if err != nil {
		return err
	}
	s.handler, err = proxy.New(pcfg, s.store, opts)
	if err != nil {
		return err
	}
	if pcfg.MaxBufferedBytes > 0 {
		s.log.Info("body buffers bounded", "max_buffered_bytes", pcfg.MaxBufferedBytes)
	}
	s.app = newAppHealth(cfg.Upstream.URL, cfg.Upstream.HealthPath, s.metrics.upstreamUp)
	if cfg.Upstream.HealthPath != "" {
		s.metrics.reg.MustRegister(s.metrics.upstreamUp)
	}
	if err := s.listen(); err != nil {
		return err
	}
	// Only now that nothing can fail: these run until ctx ends.
	wctx, cancel := context.WithCancel(ctx)
	s.closers = append(s.closers, cancel)
	if !s.embedded {
		go watchEviction(wctx, s.store, s.log, s.metrics.evictionSafe)
	}
	s.health.kind = "Redis"
	if cfg.Store.Postgres.URL != "" {
		s.health.kind = "PostgreSQL"
	}
	go s.health.watch(wctx, s.store, cfg.Store.ClaimMemoryLimit, s.log, s.metrics)
	go s.app.watch(wctx)
	if path != "" {
		rl := newReloader(path, cfg, s.handler, s.level, s.log, s.metrics)
		go rl.run(wctx)
	}
	s.log.Info("serving", "listen", s.clientAddr, "admin_listen", s.adminAddr,
		"upstream", cfg.Upstream.URL, "routes", len(cfg.Routes))
	return nil
}

// proxyOptions are the handler's collaborators: the logger, the metrics
// and, when tracing is on, the tracer (its shutdown among the closers).
func (s *server) proxyOptions(ctx context.Context) (proxy.Options, error) {
	opts := proxy.Options{Logger: s.log, Metrics: proxy.NewMetrics(s.metrics.reg), Clock: wallClock}
	tp, shutdownTracing, err := startTracing(ctx, s.cfg.Tracing, s.log)
	if err != nil {
		return opts, err
	}
	s.closers = append(s.closers, shutdownTracing)
	if tp != nil {
		opts.TracerProvider, opts.Propagator, opts.TraceTrust = tp, propagator, traceTrust(s.cfg.Tracing)
		opts.Version = serviceVersion()
	}
	return opts, nil
}

// openStore connects to Redis, or starts the embedded store when no
// address is configured, which it reports.
func (s *server) openStore(ctx context.Context, sec *secrets) error {
	if s.cfg.Store.Postgres.URL != "" {
		return s.openPostgres(ctx, sec)
	}
	redisCfg := sec.redis
	if len(redisCfg.Addrs) == 0 {
		emb, err := redisstore.StartEmbedded()
		if err != nil {
			return fmt.Errorf("start embedded store: %w", err)
		}
		s.closers = append(s.closers, emb.Close)
		s.log.Warn("USING THE EMBEDDED IN-MEMORY STORE: single instance, not durable, for development only; set store.redis.addrs in production",
			"addr", emb.Addr())
		redisCfg = config.Redis{Addrs: []string{emb.Addr()}}
		s.embedded = true
		s.metrics.evictionSafe.Set(1) // the embedded store has no memory limit and never evicts
	}
	client, err := redisstore.NewClient(clientOptions(redisCfg))
	if err != nil {
		return fmt.Errorf("store.redis.tls_ca_file: %w", err) // the only way it fails
	}
	s.closers = append(s.closers, func() { client.Close() })
	rs := redisstore.New(client, s.cfg.Store.KeyPrefix, storeOptions(s.cfg, sec, s.metrics, s.log)...)
	if redisCfg.MasterName == "" {
		rs.NameServer(redisCfg.Addrs[0]) // spans name the first address (not on Sentinel)
	}
	s.store = rs
	s.closers = append(s.closers, s.store.Close)
	preload(ctx, s.store, s.log, s.schemaReady)
	return nil
}

// openPostgres opens the durable store: a pool on store.postgres.url,
// with the schema installed at start when create_schema says so (and
// again in the background until the database answers).
func (s *server) openPostgres(ctx context.Context, sec *secrets) error {
	pg := s.cfg.Store.Postgres
	// Without listen_url the LISTEN connection is one of the pool's, held
	// from the start: the pool gets one more, so that max_conns are left
	// for the operations (docs/configuration.md).
	size := int32(pg.MaxConns)
	if pg.ListenURL == "" {
		size++
	}
	pool, err := openPool(ctx, pg, sec, size)
	if err != nil {
		return err
	}
	s.closers = append(s.closers, pool.Close)
	s.metrics.poolStats(pool.Stat)
	store := pgstore.New(pool, pg.Schema, s.cfg.Store.KeyPrefix, storeOptions(s.cfg, sec, s.metrics, s.log)...)
	if pg.CreateSchema {
		store.MigrateOnPreload(serviceVersion())
	}
	if pg.ListenURL != "" {
		lcfg, err := connConfig(pg.ListenURL, sec)
		if err != nil {
			return fmt.Errorf("store.postgres.listen_url: %w", err)
		}
		store.ListenWith(lcfg)
	}
	store.OnUnregisteredWaiter(func(err error) {
		s.log.Warn("PostgreSQL refused a waiter's registration for wake-ups: waiters (concurrent: wait, stream followers) wake by their poll only. The runtime role needs INSERT and DELETE on the waiters table: run idemproxy store migrate -grant ROLE with this release",
			"schema", pg.Schema, "err", err)
	})
	store.OnUnnamed(func(err error) {
		s.log.Warn("PostgreSQL: a server connection did not have the sidecar's named statement (a transaction pooler between them: PgBouncer before 1.21, or without max_prepared_statements): every call now goes unnamed, parsed and planned by the server each time (docs/production.md); the call that found out ran again",
			"err", err)
	})
	store.OnForeignSchema(func(err error) {
		s.log.Info("PostgreSQL: the schema belongs to another role, which installed this release's functions: serving on them without installing (store.postgres.create_schema: true does nothing for this role)",
			"schema", pg.Schema, "detail", oneLine(err))
	})
	store.OnDeafListener(func() {
		s.log.Warn("PostgreSQL wake-ups do not arrive: this sidecar's LISTEN did not hear its own NOTIFY within 5s; waiters (concurrent: wait, stream followers) wake by their poll only. Behind a transaction pooler (PgBouncer pool_mode = transaction, RDS Proxy) set store.postgres.listen_url to a URL straight to the database",
			"listen_url_set", pg.ListenURL != "")
	})
	s.store = store
	s.closers = append(s.closers, s.store.Close)
	s.metrics.evictionSafe.Set(1) // PostgreSQL never evicts a row
	preload(ctx, s.store, s.log, s.schemaReady)
	return nil
}

// pprofMux serves net/http/pprof, on admin_pprof_listen only.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// adminMux serves /metrics and the probes.
func (s *server) adminMux() *http.ServeMux {
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{Registry: s.metrics.reg}))
	if s.adminToken != nil {
		admin.Handle("/v1/keys", keysAPI{routes: s.handler, store: s.store, log: s.log, token: s.adminToken})
	}
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	admin.HandleFunc("GET /readyz", s.readyz)
	admin.Handle("GET /app/readyz", s.app)
	return admin
}

// listen opens the client and admin listeners and serves on them.
func (s *server) listen() error {
	clientLn, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	adminLn, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		clientLn.Close()
		return fmt.Errorf("admin_listen: %w", err)
	}
	s.clientAddr, s.adminAddr = clientLn.Addr().String(), adminLn.Addr().String()
	s.client = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.Client.ReadHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		Protocols:         clientProtocols(),
	}
	s.admin = &http.Server{Handler: s.adminMux(), ReadHeaderTimeout: readHeaderTimeout}
	if s.cfg.AdminPprofListen != "" {
		pprofLn, err := net.Listen("tcp", s.cfg.AdminPprofListen)
		if err != nil {
			clientLn.Close()
			adminLn.Close()
			return fmt.Errorf("admin_pprof_listen: %w", err)
		}
		s.pprofAddr = pprofLn.Addr().String()
		srv := &http.Server{Handler: pprofMux(), ReadHeaderTimeout: readHeaderTimeout}
		s.closers = append(s.closers, func() { srv.Close() })
		go func() { _ = srv.Serve(pprofLn) }()
	}
	go func() { s.errc <- s.client.Serve(clientLn) }()
	go func() { s.errc <- s.admin.Serve(adminLn) }()
	return nil
}

// wait serves until ctx ends (or a listener fails), then drains: it fails
// readiness, waits for load balancers to notice, stops accepting, lets
// in-flight requests settle and store, and closes the store.
func (s *server) wait(ctx context.Context) error {
	defer s.close()
	select {
	case err := <-s.errc:
		return err
	case <-ctx.Done():
	}
	s.draining.Store(true)
	grace := s.cfg.Grace()
	s.log.Info("draining", "delay", s.cfg.Drain.Delay.String(), "timeout", grace.String())
	time.Sleep(s.cfg.Drain.Delay)
	err := s.drain(grace)
	actx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.admin.Shutdown(actx)
	if err != nil {
		return err
	}
	s.log.Info("stopped")
	return nil
}

// drain stops the client server accepting and waits up to grace for the
// requests in flight, late upstream calls included, to settle and store.
// Calls still running then are cancelled and settled by their routes'
// unknown_outcome, rather than left to the dual-write window by the exit.
func (s *server) drain(grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := s.client.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		n := s.handler.Abandon()
		s.log.Error("drain.timeout ran out with requests in flight: cancelling their upstream calls; each key is settled by its route's unknown_outcome",
			"timeout", grace.String(), "upstream_calls", n)
		actx, acancel := context.WithTimeout(context.Background(), abandonWait)
		defer acancel()
		err = s.client.Shutdown(actx)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("drain: %w", err)
	}
	return nil
}

// close releases what start opened, last first.
func (s *server) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// schemaReady records whether the store's scripts or schema are in place
// (idemproxy_store_schema_ready); once they were, the sidecar may be
// ready.
func (s *server) schemaReady(ready bool) {
	if ready {
		s.schemaSeen.Store(true) // before the gauge: whoever sees 1 finds the sidecar ready
		s.metrics.schemaReady.Set(1)
		return
	}
	s.metrics.schemaReady.Set(0)
}

// readyz answers 200 while the sidecar can serve: listeners bound, config
// loaded, the store's scripts or schema seen in place since it started,
// not draining. Once the store worked, its outages are not part of it
// unless admin.readiness_requires_store says so: the sidecar's readiness
// is the pod's, and a store outage must not take the app's pass-through
// traffic out of its Service. Before, a pod whose store never worked (a
// schema never migrated, a role without rights, a store unreachable from
// this pod) is not ready: a rollout of such pods waits instead of
// replacing every pod that works. ?verbose lists the store's health for
// humans.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	storeUp := s.health.up()
	status, why := http.StatusOK, "ok"
	switch {
	case s.draining.Load():
		status, why = http.StatusServiceUnavailable, "draining"
	case !s.schemaSeen.Load():
		status, why = http.StatusServiceUnavailable, "the store has not worked since start: never reached, or its scripts or schema not in place (idemproxy_store_schema_ready 0; the log says why): check the store, or run idemproxy store migrate"
	case s.cfg.Admin.ReadinessRequiresStore && !storeUp:
		status, why = http.StatusServiceUnavailable, "store unavailable (admin.readiness_requires_store)"
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintln(w, why)
	if _, verbose := r.URL.Query()["verbose"]; !verbose {
		return
	}
	s.health.mu.Lock()
	masters, checked := s.health.masters, s.health.checked
	s.health.mu.Unlock()
	if checked.IsZero() {
		fmt.Fprintln(w, "store: not looked at yet")
		return
	}
	fmt.Fprintf(w, "store: up=%t (looked %s ago)\n", storeUp, time.Since(checked).Round(time.Millisecond))
	if !bearerOK(r, s.adminToken) {
		// The masters' addresses and errors are for operators: anyone
		// who reaches the admin port (a probe, a scraper) sees only up.
		fmt.Fprintln(w, "  (each master's address and error: send the admin token, admin.token_file, as a bearer token)")
		return
	}
	for _, line := range describe(masters) {
		fmt.Fprintln(w, "  master "+line)
	}
}

// clientProtocols are what listen speaks: HTTP/1.1, and HTTP/2 without TLS
// (prior knowledge), which gRPC clients use (routes[].protocol: grpc).
func clientProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}
