package main

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/proxy"
)

// reloadQuiet is how long the config directory must be quiet after a
// change before it is read: an editor or the kubelet writes in steps.
const reloadQuiet = 200 * time.Millisecond

// reloader reloads routes when the config file changes or on SIGHUP. An
// invalid file is rejected, logged and counted; the old config keeps
// serving.
type reloader struct {
	path    string
	handler *proxy.Handler
	level   *slog.LevelVar
	log     *slog.Logger
	total   *prometheus.CounterVec
	success prometheus.Gauge

	// hup is registered for SIGHUP before serving starts, so a SIGHUP is
	// never the default "terminate" once the process serves.
	hup chan os.Signal

	// current and sum are only touched by run's goroutine; so are
	// failing (the last reload was rejected) and rejected, what it said:
	// the rejected content's sum, or the error reading the file.
	current  *config.Config
	sum      [sha256.Size]byte
	failing  bool
	rejected string
}

func newReloader(path string, cfg *config.Config, h *proxy.Handler, level *slog.LevelVar, logger *slog.Logger, m *metrics) *reloader {
	r := &reloader{
		path:    path,
		handler: h,
		level:   level,
		log:     logger,
		current: cfg,
		total:   m.reloads,
		success: m.reloadOK,
	}
	r.success.Set(1)
	r.hup = make(chan os.Signal, 1)
	signal.Notify(r.hup, syscall.SIGHUP)
	if b, err := os.ReadFile(path); err == nil {
		r.sum = sha256.Sum256(b)
	}
	return r
}

// run watches the file's directory, not the file: a Kubernetes ConfigMap
// volume updates by swapping a symlink, which a watch on the file itself
// would miss after the first update.
func (r *reloader) run(ctx context.Context) {
	defer signal.Stop(r.hup)

	var events <-chan fsnotify.Event
	var errs <-chan error
	w, err := fsnotify.NewWatcher()
	if err == nil {
		err = w.Add(filepath.Dir(r.path))
	}
	if err != nil {
		r.log.Warn("cannot watch the config file; reload with SIGHUP", "path", r.path, "err", err)
	} else {
		defer w.Close()
		events, errs = w.Events, w.Errors
		// A change between the start and the watch would otherwise go
		// unnoticed until the next one: look once now (an unchanged file
		// is not reloaded).
		r.reload("file change", false)
	}
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.hup:
			r.reload("SIGHUP", true)
		case <-events:
			quiet.Reset(reloadQuiet)
		case err := <-errs:
			r.log.Warn("config watch error", "err", err)
		case <-quiet.C:
			r.reload("file change", false)
		}
	}
}

// reload loads and applies the file. Unless forced, an unchanged file is
// not reloaded.
func (r *reloader) reload(trigger string, force bool) {
	b, err := os.ReadFile(r.path)
	if err != nil {
		r.fail(trigger, err, "read: "+err.Error(), force)
		return
	}
	sum := sha256.Sum256(b)
	if sum == r.sum && !force {
		if r.failing {
			// Back to the running config (a rollback, a reverted
			// ConfigMap): nothing to apply, and nothing failing any more.
			r.failing, r.rejected = false, ""
			r.log.Info("config file is the running config again; the rejected one is gone", "trigger", trigger, "path", r.path)
			r.success.Set(1)
		}
		return
	}
	cfg, err := config.Load(r.path)
	var hooks webhookSecrets
	if err == nil {
		hooks, err = readWebhookSecrets(cfg) // a rotated webhook secret reloads with its route
	}
	if err == nil {
		err = r.handler.Reload(proxyRoutes(cfg.Routes, hooks))
	}
	if err == nil {
		r.handler.SetWriteTimeout(cfg.Client.WriteTimeout)
	}
	if err != nil {
		r.fail(trigger, err, string(sum[:]), force)
		return
	}
	r.sum, r.failing, r.rejected = sum, false, ""
	for _, c := range config.RestartOnly(r.current, cfg) {
		r.log.Warn("config key changed but needs a restart to take effect; the running value stays", "key", c)
	}
	// Keep the values in force for the keys that did not reload, so the
	// next comparison is against what actually runs.
	routes := cfg.Routes
	next := *r.current
	next.Routes = routes
	next.LogLevel = cfg.LogLevel
	r.level.Set(cfg.SlogLevel())
	r.current = &next
	r.total.WithLabelValues("ok").Inc()
	r.success.Set(1)
	r.log.Info("config reloaded", "trigger", trigger, "routes", len(routes))
}

// fail rejects a reload: counted and logged once per distinct rejected
// content (what), however often the directory changes meanwhile (a log
// file beside the config), and again on every SIGHUP (force).
func (r *reloader) fail(trigger string, err error, what string, force bool) {
	if r.failing && r.rejected == what && !force {
		return
	}
	r.failing, r.rejected = true, what
	r.total.WithLabelValues("error").Inc()
	r.success.Set(0)
	r.log.Error("config reload rejected; the previous config keeps serving", "trigger", trigger, "path", r.path, "err", err)
}
