package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// server is one running idemproxy: its store, handler and listeners. start
// opens it and serves in the background; wait blocks until the context
// ends, then drains and closes it.
type server struct {
	cfg     *config.Config
	log     *slog.Logger
	level   *slog.LevelVar
	metrics *metrics
	store   *claim.Store
	handler *proxy.Handler
	// client and admin serve on clientAddr and adminAddr, where their
	// listeners are bound.
	client, admin         *http.Server
	clientAddr, adminAddr string
	// adminToken, when set, enables the key API on the admin port.
	adminToken []byte
	// pprofAddr is where pprof listens; empty when it does not.
	pprofAddr string
	// errc receives the first listener that stops serving.
	errc     chan error
	draining atomic.Bool
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
// serves on them in the background.
func start(ctx context.Context, cfg *config.Config, path string, logger *slog.Logger) (s *server, err error) {
	s = &server{cfg: cfg, level: new(slog.LevelVar), errc: make(chan error, 2)}
	s.level.Set(cfg.SlogLevel())
	s.log = slog.New(leveled{next: logger.Handler(), level: s.level})
	// go-redis has one process-wide logger; route it into ours.
	redis.SetLogger(claim.SlogLogger{Logger: s.log})
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	for _, w := range cfg.Warnings() {
		s.log.Warn(w)
	}
	s.metrics = newMetrics(cfg.Store.WaitReplicas > 0)
	embedded, err := s.openStore(ctx)
	if err != nil {
		return nil, err
	}
	pcfg, err := proxyConfig(cfg)
	if err != nil {
		return nil, err
	}
	opts := proxy.Options{Logger: s.log, Metrics: proxy.NewMetrics(s.metrics.reg), BodyReadTimeout: cfg.Client.BodyTimeout}
	tp, err := s.startTracing(ctx)
	if err != nil {
		return nil, err
	}
	if tp != nil {
		opts.TracerProvider, opts.Propagator = tp, propagator
	}
	s.handler, err = proxy.New(pcfg, s.store, opts)
	if err != nil {
		return nil, err
	}
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_buffered_bytes",
		Help: "Bytes held in request and response body buffers now; limits.max_buffered_bytes bounds it.",
	}, func() float64 { return float64(s.handler.BufferedBytes()) }))
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idemproxy_waiting_retries",
		Help: "Retries waiting now for a first attempt's outcome (concurrent: wait).",
	}, func() float64 { return float64(s.handler.Waiting()) }))
	if pcfg.MaxBufferedBytes > 0 {
		s.log.Info("body buffers bounded", "max_buffered_bytes", pcfg.MaxBufferedBytes)
	}
	if embedded {
		s.metrics.evictionSafe.Set(1) // the embedded store has no memory limit and never evicts
	} else {
		go watchEviction(ctx, s.store, s.log, s.metrics.evictionSafe)
		go watchMemory(ctx, s.store, cfg.Store.ClaimMemoryLimit, s.log, s.metrics)
	}
	if path != "" {
		rl := newReloader(path, cfg, s.handler, s.level, s.log, s.metrics)
		go rl.run(ctx)
	}
	if cfg.Admin.TokenFile != "" {
		b, err := os.ReadFile(cfg.Admin.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("admin.token_file: %w", err)
		}
		if s.adminToken = []byte(strings.TrimSpace(string(b))); len(s.adminToken) < 16 {
			return nil, fmt.Errorf("admin.token_file: %s holds %d characters, want at least 16", cfg.Admin.TokenFile, len(s.adminToken))
		}
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	s.log.Info("serving", "listen", s.clientAddr, "admin_listen", s.adminAddr,
		"upstream", cfg.Upstream.URL, "routes", len(cfg.Routes))
	return s, nil
}

// openStore connects to Redis, or starts the embedded store when no
// address is configured, which it reports.
func (s *server) openStore(ctx context.Context) (embedded bool, err error) {
	redisCfg := s.cfg.Store.Redis
	if len(redisCfg.Addrs) == 0 {
		emb, err := claim.StartEmbedded()
		if err != nil {
			return false, fmt.Errorf("start embedded store: %w", err)
		}
		s.closers = append(s.closers, emb.Close)
		s.log.Warn("USING THE EMBEDDED IN-MEMORY STORE: single instance, not durable, for development only; set store.redis.addrs in production",
			"addr", emb.Addr())
		redisCfg = config.Redis{Addrs: []string{emb.Addr()}}
		embedded = true
	}
	if err := readSecrets(&redisCfg); err != nil {
		return false, err
	}
	client, err := claim.NewClient(clientOptions(redisCfg))
	if err != nil {
		return false, fmt.Errorf("store.redis.tls_ca_file: %w", err) // the only way it fails
	}
	s.closers = append(s.closers, func() { client.Close() })
	opts, err := sealingOptions(s.cfg.Store)
	if err != nil {
		return false, err
	}
	if s.cfg.Store.WaitReplicas > 0 {
		opts = append(opts, claim.WithWait(s.cfg.Store.WaitReplicas, s.cfg.Store.WaitTimeout, func(op string) {
			s.metrics.waitShort.WithLabelValues(op).Inc()
		}))
	}
	opts = append(opts, claim.WithPipeline(s.cfg.Store.Pipeline), claim.WithBatchObserver(func(n int) {
		s.metrics.batchOps.Observe(float64(n))
	}))
	s.store = claim.New(client, s.cfg.Store.KeyPrefix, opts...)
	s.closers = append(s.closers, s.store.Close)
	preload(ctx, s.store, s.log)
	return embedded, nil
}

// sealingOptions reads the encryption key files and the key derivation
// secret (mounted Secrets, base64) into the store's options.
func sealingOptions(st config.Store) ([]claim.Option, error) {
	var secret []byte
	if st.KeySecretFile != "" {
		b, err := readBase64(st.KeySecretFile, 16)
		if err != nil {
			return nil, fmt.Errorf("store.key_secret_file: %w", err)
		}
		secret = b
	}
	if len(st.Encryption.KeyFiles) == 0 {
		if secret != nil {
			return []claim.Option{claim.WithKeySecret(secret)}, nil
		}
		return nil, nil
	}
	var keys [][]byte
	for i, f := range st.Encryption.KeyFiles {
		k, err := readBase64(f, claim.KeySize)
		if err == nil && len(k) != claim.KeySize {
			err = fmt.Errorf("%s holds %d bytes, want %d (head -c 32 /dev/urandom | base64)", f, len(k), claim.KeySize)
		}
		if err != nil {
			return nil, fmt.Errorf("store.encryption.key_files[%d]: %w", i, err)
		}
		keys = append(keys, k)
	}
	opt, err := claim.WithSealing(keys, st.Encryption.Required, secret)
	if err != nil {
		return nil, fmt.Errorf("store.encryption.key_files: %w", err)
	}
	return []claim.Option{opt}, nil
}

// readBase64 reads a file holding base64 (surrounding space ignored) of at
// least min bytes.
func readBase64(path string, min int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s is not base64: %w", path, err)
	}
	if len(out) < min {
		return nil, fmt.Errorf("%s holds %d bytes, want at least %d", path, len(out), min)
	}
	return out, nil
}

// readSecrets reads the passwords configured as files (mounted Secrets).
func readSecrets(r *config.Redis) error {
	for _, secret := range []struct {
		key, file string
		dst       *string
	}{
		{"store.redis.password_file", r.PasswordFile, &r.Password},
		{"store.redis.sentinel_password_file", r.SentinelPasswordFile, &r.SentinelPassword},
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
		admin.Handle("/v1/keys", keysAPI{s: s, token: s.adminToken})
	}
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	admin.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		pctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := s.store.Ping(pctx); err != nil {
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
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
