package proxy

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a protected request, the values of the outcome label of
// idemproxy_requests_total. Each request is counted once, for its final
// outcome.
const (
	outcomeClaimed    = "claimed"     // owned and forwarded, outcome unknown, claim kept
	outcomeReplayed   = "replayed"    // answered from the stored response
	outcomeConflict   = "conflict"    // 409: in progress, or stored without a body
	outcomeMismatch   = "mismatch"    // 422: same key, different request
	outcomeReleased   = "released"    // forwarded, transient answer, claim released
	outcomeStored     = "stored"      // forwarded, settled answer stored
	outcomeBypassed   = "bypassed"    // forwarded unprotected (optional key, fail_open)
	outcomeStoreError = "store_error" // store unreachable or unreadable
	outcomeFenceLost  = "fence_lost"  // forwarded, but another owner held the key at completion
	outcomeRejected   = "rejected"    // bad key, identity or size; nothing forwarded
)

// outcomes lists every outcome, to create each series at zero.
var outcomes = []string{
	outcomeClaimed, outcomeReplayed, outcomeConflict, outcomeMismatch, outcomeReleased,
	outcomeStored, outcomeBypassed, outcomeStoreError, outcomeFenceLost, outcomeRejected,
}

// storeOps are the values of the op label.
var storeOps = []string{"claim", "get", "renew", "complete", "release"}

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	requests     *prometheus.CounterVec
	storeSeconds *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	upstream     *prometheus.HistogramVec
	added        *prometheus.HistogramVec
	storedBytes  prometheus.Histogram
	claims       *claimAges
	renewals     *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg; a nil reg
// leaves them unregistered (tests, or a caller that exposes no metrics).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claims: &claimAges{started: map[*owner]time.Time{}, now: time.Now},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_requests_total",
			Help: "Protected requests by route and final outcome.",
		}, []string{"route", "outcome"}),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_store_operation_seconds",
			Help:    "Latency of store operations by op.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_store_errors_total",
			Help: "Store operations that failed, by op.",
		}, []string{"op"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_upstream_seconds",
			Help:    "Time from forwarding a protected request to the upstream's response headers, by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		added: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_added_latency_seconds",
			Help:    "Time a protected request spent in idemproxy, excluding the upstream, by route.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
		storedBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemproxy_stored_response_bytes",
			Help:    "Size of stored records.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 8),
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_lease_renewals_total",
			Help: "Lease renewals by result (ok, lost, error).",
		}, []string{"result"}),
	}
	// Series that exist from the start make rate() and absent-based alerts
	// work before the first error.
	for _, op := range storeOps {
		m.storeErrors.WithLabelValues(op)
	}
	for _, r := range []string{"ok", "lost", "error"} {
		m.renewals.WithLabelValues(r)
	}
	if reg != nil {
		inFlight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_inflight_claims",
			Help: "Claims this process owns and has not settled yet.",
		}, m.claims.count)
		oldest := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "idemproxy_oldest_inflight_claim_seconds",
			Help: "Age of the oldest claim this process owns and has not settled; 0 when none.",
		}, m.claims.oldest)
		reg.MustRegister(m.requests, m.storeSeconds, m.storeErrors, m.upstream, m.added, m.storedBytes, inFlight, m.renewals, oldest)
	}
	return m
}

// initRoutes creates every route's outcome series at zero.
func (m *Metrics) initRoutes(rt *router) {
	for _, name := range rt.names {
		for _, o := range outcomes {
			m.requests.WithLabelValues(name, o)
		}
	}
}

// claimAges tracks when each in-flight claim started, for their number and
// the age of the oldest: a claim held far past the upstream timeout means a
// stuck upstream call or a bug, and is worth an alert.
type claimAges struct {
	mu      sync.Mutex // guards started
	started map[*owner]time.Time
	now     func() time.Time
}

func (c *claimAges) add(o *owner) {
	c.mu.Lock()
	c.started[o] = c.now()
	c.mu.Unlock()
}

func (c *claimAges) remove(o *owner) {
	c.mu.Lock()
	delete(c.started, o)
	c.mu.Unlock()
}

func (c *claimAges) count() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return float64(len(c.started))
}

func (c *claimAges) oldest() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, t := range c.started {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if first.IsZero() {
		return 0
	}
	return c.now().Sub(first).Seconds()
}
