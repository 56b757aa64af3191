package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/config"
)

// run is the whole program: it parses args, and either checks a config,
// runs the demo, or serves until ctx is cancelled and in-flight requests
// have settled.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "demo" {
		return runDemo(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "keys" {
		return runKeys(ctx, args[1:], stdout, stderr)
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
	return serve(ctx, cfg, *path, logger)
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

// memoryCheckInterval is how often Redis' memory use is read for
// store.claim_memory_limit: one INFO per master per second.
const memoryCheckInterval = time.Second

// watchMemory refuses new claims while Redis is above limit of its
// maxmemory, so that the claims in flight keep room to store their
// outcome, and keeps the gauges current.
func watchMemory(ctx context.Context, store *claim.Store, limit float64, logger *slog.Logger, m *metrics) {
	t := time.NewTicker(memoryCheckInterval)
	defer t.Stop()
	full := false
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		ratio, err := store.MemoryUsage(rctx)
		cancel()
		if err == nil {
			m.memoryUsed.Set(ratio)
			now := limit > 0 && ratio >= limit
			store.SetFull(now)
			switch {
			case now && !full:
				m.storeFull.Set(1)
				logger.Error("REDIS IS NEARLY FULL: new claims are refused (503 store-full) so that requests in flight can store their outcome; free memory or raise maxmemory",
					"used_ratio", ratio, "claim_memory_limit", limit)
			case !now && full:
				m.storeFull.Set(0)
				logger.Warn("Redis below store.claim_memory_limit again: claims accepted", "used_ratio", ratio)
			}
			full = now
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
