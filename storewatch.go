package main

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/claim"
)

// preload loads the scripts, or installs and checks the schema. A failure
// does not stop the start: the store may come up later; until then
// protected routes answer per store_unavailable, idemproxy_store_up and
// idemproxy_store_schema_ready say so, /readyz answers 503 (a pod whose
// store never worked takes no traffic: a rollout waits on it instead of
// going dark), and the error is logged once, in one line. ready hears
// each outcome.
func preload(ctx context.Context, store claim.Backend, logger *slog.Logger, ready func(bool)) {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := store.Preload(pctx); err != nil {
		ready(false)
		logger.Warn("store not ready at start (unreachable, or its scripts or schema cannot be installed or are missing): protected routes answer per store_unavailable and /readyz 503 until it is; retried with backoff",
			"err", oneLine(err))
		go preloadLater(ctx, store, logger, ready)
		return
	}
	ready(true)
}

// preloadLater runs Preload again, 2 s after the last try and doubling up
// to a minute, until it succeeds (the store's scripts or schema are then
// in place) or ctx ends. An error other than the one logged before is
// logged once.
func preloadLater(ctx context.Context, store claim.Backend, logger *slog.Logger, ready func(bool)) {
	wait, last := 2*time.Second, ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := store.Preload(pctx)
		cancel()
		if err == nil {
			ready(true)
			logger.Info("store ready: preloaded")
			return
		}
		if msg := oneLine(err); msg != last {
			if last != "" {
				logger.Warn("store still not ready", "err", msg, "next_try_in", wait.String())
			}
			last = msg
		}
	}
}

// oneLine is err's message on one line, at most 1,000 bytes: a driver's
// error never floods the log.
func oneLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if len(msg) > 1000 {
		msg = msg[:1000] + "…"
	}
	return msg
}

// healthCheckInterval is how often the store watcher looks at every
// master: one INFO memory each.
const healthCheckInterval = time.Second

// storeHealth is what the store watcher last saw: which masters answered.
// It feeds idemproxy_store_up, /readyz?verbose and, with
// admin.readiness_requires_store, readiness.
type storeHealth struct {
	// kind names the store in what the watcher logs ("Redis",
	// "PostgreSQL"): on-call reads the store it has.
	kind string
	// mu guards masters and checked.
	mu      sync.Mutex
	masters []claim.MasterHealth
	checked time.Time
}

// up reports whether every master answered at the last look; false before
// the first.
func (h *storeHealth) up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.checked.IsZero() {
		return false
	}
	for _, m := range h.masters {
		if !m.Up() {
			return false
		}
	}
	return true
}

// watch looks at the store every healthCheckInterval until ctx ends:
// it keeps idemproxy_store_up per master, refuses new claims while Redis
// is above limit of its maxmemory (so that the claims in flight keep room
// to store their outcome), and logs each change once.
func (h *storeHealth) watch(ctx context.Context, store claim.Backend, limit float64, logger *slog.Logger, m *metrics) {
	t := time.NewTicker(healthCheckInterval)
	defer t.Stop()
	full, wasUp := false, true
	known := map[string]bool{}
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		masters := store.Health(rctx)
		cancel()
		ectx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = store.CheckEpochs(ectx) // a loss is counted and logged by the store's observer
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		h.masters, h.checked = masters, time.Now()
		h.mu.Unlock()
		up := h.up()
		setStoreSize(m.storeKeys, m.storeBytes, known, masters)
		setCleanup(m, masters)
		setClockOffsets(m.clockOffset, known, masters)
		setStoreUp(m.storeUp, known, masters)
		switch {
		case !up && wasUp:
			logger.Error("STORE DOWN: "+h.kind+" does not answer, or refuses idemproxy's statements (see masters for its error); protected routes answer per store_unavailable (fail_closed: 503 store-unavailable, nothing forwarded); pass-through traffic is served",
				"store", h.kind, "masters", describe(masters))
		case up && !wasUp:
			logger.Warn("store up again: protected routes are protected again", "store", h.kind, "masters", describe(masters))
		}
		wasUp = up
		if up {
			ratio := 0.0
			for _, mh := range masters {
				ratio = max(ratio, mh.MemoryRatio)
			}
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

// setClockOffsets sets each master's clock offset from its last look (the
// store's clock minus this process'); a master whose clock was not read
// this time keeps its last value, one no longer listed (known holds the
// masters of the look before) loses its series.
func setClockOffsets(g *prometheus.GaugeVec, known map[string]bool, masters []claim.MasterHealth) {
	listed := map[string]bool{}
	for _, mh := range masters {
		listed[mh.Master] = true
		if mh.Clock != nil {
			g.WithLabelValues(mh.Master).Set(-mh.Clock.Offset().Seconds())
		}
	}
	if len(masters) == 1 && masters[0].Master == "" {
		return // the deployment could not even list its masters
	}
	for name := range known {
		if !listed[name] {
			g.DeleteLabelValues(name)
		}
	}
}

// setStoreUp sets idemproxy_store_up for each master seen. A master no
// longer listed (a Cluster failover moved its slots) loses its series; when
// the deployment could not even list its masters, every known one is down.
func setStoreUp(g *prometheus.GaugeVec, known map[string]bool, masters []claim.MasterHealth) {
	if len(masters) == 1 && masters[0].Master == "" {
		for name := range known {
			g.WithLabelValues(name).Set(0)
		}
		if len(known) == 0 {
			g.WithLabelValues("").Set(0)
		}
		return
	}
	seen := map[string]bool{}
	for _, mh := range masters {
		seen[mh.Master] = true
		v := 0.0
		if mh.Up() {
			v = 1
		}
		g.WithLabelValues(mh.Master).Set(v)
	}
	for name := range known {
		if !seen[name] {
			g.DeleteLabelValues(name)
		}
	}
	clear(known)
	for name := range seen {
		known[name] = true
	}
	if !seen[""] {
		g.DeleteLabelValues("")
	}
}

// setStoreSize sets each master's key count and memory from its last look;
// a master that did not tell (down, or the embedded store), or is no longer
// listed (known holds the masters of the look before), has no series, so
// that sums never hold a stale size.
func setStoreSize(keys, used *prometheus.GaugeVec, known map[string]bool, masters []claim.MasterHealth) {
	listed := map[string]bool{}
	for _, mh := range masters {
		listed[mh.Master] = true
	}
	for name := range known {
		if !listed[name] {
			keys.DeleteLabelValues(name)
			used.DeleteLabelValues(name)
		}
	}
	for _, mh := range masters {
		if !mh.Sized {
			keys.DeleteLabelValues(mh.Master)
			used.DeleteLabelValues(mh.Master)
			continue
		}
		keys.WithLabelValues(mh.Master).Set(float64(mh.Keys))
		used.WithLabelValues(mh.Master).Set(float64(mh.UsedBytes))
	}
}

// setCleanup sets idemproxy_store_bytes of each master that told its
// size, and the cleanup gauges of each that reports its cleanup
// (claim.Cleanup: the PostgreSQL store).
func setCleanup(m *metrics, masters []claim.MasterHealth) {
	for _, mh := range masters {
		if mh.Sized {
			m.size.WithLabelValues(mh.Master).Set(float64(mh.UsedBytes))
		}
		if c := mh.Cleanup; c != nil {
			m.expired.WithLabelValues(mh.Master).Set(float64(c.Expired))
			m.cleanupLag.WithLabelValues(mh.Master).Set(c.Lag.Seconds())
			m.oldestClaim.WithLabelValues(mh.Master).Set(c.OldestClaim.Seconds())
		}
	}
}

// describe lists masters for a log line: name=up or name=error.
func describe(masters []claim.MasterHealth) []string {
	out := make([]string, 0, len(masters))
	for _, mh := range masters {
		state := "up"
		if mh.Err != nil {
			state = mh.Err.Error()
		}
		out = append(out, mh.Master+": "+state)
	}
	slices.Sort(out)
	return out
}

// evictionCheckInterval is how often Redis' eviction policy is re-read: an
// operator may change it at run time with CONFIG SET.
const evictionCheckInterval = 5 * time.Minute

// watchEviction warns loudly, at start and then periodically, when Redis
// can evict idempotency keys, and keeps the gauge current.
func watchEviction(ctx context.Context, store claim.Backend, logger *slog.Logger, safe prometheus.Gauge) {
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

func checkEviction(ctx context.Context, store claim.Backend, logger *slog.Logger, safe prometheus.Gauge) {
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
