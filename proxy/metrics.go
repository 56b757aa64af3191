package proxy

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/claim"
)

// Outcomes of a protected request, the values of the outcome label of
// idemproxy_requests_total. Each request is counted once, for its final
// outcome.
const (
	outcomeClaimed  = "claimed"  // owned and forwarded, outcome unknown, claim kept
	outcomeReplayed = "replayed" // answered from the stored response
	outcomeConflict = "conflict" // 409: in progress, or stored without a body
	outcomeMismatch = "mismatch" // 422: same key, different request
	outcomeReleased = "released" // forwarded, transient answer, claim released
	outcomeStored   = "stored"   // forwarded, settled answer stored
	outcomeBypassed = "bypassed" // forwarded unprotected (optional key, fail_open)
	// outcomeStoreError is only ever the dual-write window: the upstream
	// acted (or may have) and its answer could not be stored.
	outcomeStoreError = "store_error"
	// outcomeStoreUnavailable: no claim could be made (or the record not
	// read); nothing was forwarded.
	outcomeStoreUnavailable = "store_unavailable"
	// outcomeRecordUnreadable: the stored record could not be decoded or
	// opened; nothing was forwarded and the record was left alone.
	outcomeRecordUnreadable = "record_unreadable"
	outcomeFenceLost        = "fence_lost" // forwarded, but another owner held the key at completion
	outcomeRejected         = "rejected"   // bad key, identity or size; nothing forwarded
	// outcomeUpstreamTimeout: the client was answered 504 at
	// upstream.timeout while the upstream call went on; how that late
	// call ended is idemproxy_late_answers_total's, a second event.
	outcomeUpstreamTimeout = "upstream_timeout"
	// outcomeReconciled: answered from what the upstream's reconcile
	// lookup said happened (reconcile.go).
	outcomeReconciled = "reconciled"
)

// outcomes lists every outcome, to create each series at zero.
var outcomes = []string{
	outcomeClaimed, outcomeReplayed, outcomeConflict, outcomeMismatch, outcomeReleased,
	outcomeStored, outcomeBypassed, outcomeStoreError, outcomeFenceLost, outcomeRejected,
	outcomeStoreUnavailable, outcomeRecordUnreadable, outcomeUpstreamTimeout, outcomeReconciled,
}

// Results of a delivery, the values of idemproxy_webhook_deliveries_total's
// result label.
const (
	webhookExecuted   = "executed"          // forwarded as the first delivery
	webhookReplayed   = "replayed"          // a redelivery, answered from the record
	webhookInProgress = "in_progress"       // a redelivery while the first still runs
	webhookSigInvalid = "signature_invalid" // missing, wrong or stale signature
	webhookRefused    = "refused"           // anything else refused (no id, too large, store down)
)

// Results of a late call, the values of the result label of
// idemproxy_late_answers_total.
const (
	lateStored    = "stored"    // the late answer was stored for the retries
	lateReleased  = "released"  // the late answer was transient: key released
	lateAbandoned = "abandoned" // no answer: window, cap or drain ran out, or the call broke
	lateUnstored  = "unstored"  // answered, but the store refused or failed (fence_lost, store_error)
)

var lateResults = []string{lateStored, lateReleased, lateAbandoned, lateUnstored}

// storeOps are the store operations, the values of the op label. A new
// operation is one line here; the store names its span (claim.Span).
var storeOps = []string{
	"claim", "get", "renew", "complete", "release", "epoch", "take_over",
	"free_absent", "stream_start", "stream_append", "stream_end", "stream_read",
}

// Results of an unconfirmed claim, the values of the result label of
// idemproxy_unconfirmed_claims_total.
const (
	unconfirmedReleased = "released"         // it had landed; deleted
	unconfirmedNotFound = "not_found"        // it never landed (or someone else holds the key)
	unconfirmedGaveUp   = "gave_up"          // Redis did not answer before the claim would lapse, or too many pending
	unconfirmedOnRetry  = "cleared_on_retry" // a later attempt found it never forwarded and freed it
)

var unconfirmedResults = []string{unconfirmedReleased, unconfirmedNotFound, unconfirmedGaveUp, unconfirmedOnRetry}

// Reasons a take was refused, the values of the reason label of
// idemproxy_late_calls_refused_total and idemproxy_overloaded_total.
const (
	refusedCap      = "process_cap"     // the process' total is reached
	refusedShare    = "principal_share" // this principal holds its whole share
	refusedReserved = "reserved"        // the last share is kept for principals that hold none
)

// Reasons of a 412, the values of idemproxy_first_sent_refused_total's
// reason label.
const (
	refusedKeyExpired = "key-expired"
	refusedRecordLost = "record-lost"
)

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	requests     *prometheus.CounterVec
	storeSeconds *prometheus.HistogramVec
	// storeTimes are storeSeconds' series of storeOps, looked up once:
	// every store call observes one (storeTime).
	storeTimes  map[string]prometheus.Observer
	storeErrors *prometheus.CounterVec
	upstream    *prometheus.HistogramVec
	added       *prometheus.HistogramVec
	storedBytes prometheus.Histogram
	// state is what the gauges read (in-flight claims, buffered bytes,
	// waiting retries): the Handler New built last; none reads 0.
	state    atomic.Pointer[gaugeState]
	renewals *prometheus.CounterVec
	// lateAnswers counts late calls by how they ended; lateCalls is how
	// many run now.
	lateAnswers *prometheus.CounterVec
	lateCalls   prometheus.Gauge
	// retention is each route's retention, for the expected store size.
	retention *prometheus.GaugeVec
	// overloaded counts first attempts refused for max_in_flight.
	overloaded *prometheus.CounterVec
	// lateRefused counts calls refused a late slot, by route and reason.
	lateRefused *prometheus.CounterVec
	// unknownOutcomes counts requests whose outcome was unknown, by the
	// unknown_outcome that handled them (or orphan, for a vanished owner's
	// claim settled by a later attempt).
	unknownOutcomes *prometheus.CounterVec
	// authorizations counts replay authorizations by result (allowed,
	// forbidden, unavailable); authorizeSeconds times them.
	authorizations *prometheus.CounterVec
	// reconciled counts reconcile lookups by route and result (found,
	// absent, too_early, unresolved).
	reconciled *prometheus.CounterVec
	// streamChunks, streamAttached and streamFirstByte are the streamed
	// answers' (stream.go), by route.
	streamChunks, streamAttached *prometheus.CounterVec
	// wakeups counts how waiters (concurrent: wait, stream followers)
	// were woken to look at their key: notify or poll.
	wakeups      *prometheus.CounterVec
	wakeupNotify prometheus.Counter
	wakeupPoll   prometheus.Counter
	// streamLagging counts owners' clients that fell behind a stream and
	// read the rest of it back from the store; streamEnds how streams
	// ended.
	streamLagging, streamEnds *prometheus.CounterVec
	streamFirstByte           *prometheus.HistogramVec
	// unconfirmed counts claims whose reply never came, by how they were
	// cleaned up (unconfirmed.go).
	unconfirmed *prometheus.CounterVec
	// passThrough counts unprotected requests by the class of their
	// answer; passThroughClass holds its series by status/100 (1 to 5),
	// resolved once rather than per request.
	passThrough      *prometheus.CounterVec
	passThroughClass [6]prometheus.Counter
	// firstSentRefused counts 412s by route and reason (firstsent.go).
	firstSentRefused *prometheus.CounterVec
	// webhooks counts webhook deliveries by route and result.
	webhooks *prometheus.CounterVec
	// quotaRefusals counts claims refused for quota.new_keys, by route.
	quotaRefusals *prometheus.CounterVec
	// recordErrors counts stored records that could not be read, by
	// reason (corrupt, tampered, unknown_key, unsealed, no_keys).
	recordErrors     *prometheus.CounterVec
	authorizeSeconds prometheus.Histogram
}

// unknownOrphan is the handling label of an orphaned claim settled as
// outcome-unknown by a later attempt.
const unknownOrphan = "orphan"

// NewMetrics creates the collectors and registers them with reg; a nil reg
// leaves them unregistered (tests, or a caller that exposes no metrics).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
		lateAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_late_answers_total",
			Help: "Upstream calls that ran past upstream.timeout after the client got 504, by route and result (stored, released, abandoned, unstored).",
		}, []string{"route", "result"}),
		lateCalls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_late_calls",
			Help: "Upstream calls running past upstream.timeout now, waiting for a late answer; capped by upstream.max_late_calls.",
		}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_quota_refusals_total",
			Help: "New keys refused with 429 too-many-keys for a route's quota.new_keys, by route.",
		}, []string{"route"}),
		recordErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_record_errors_total",
			Help: "Stored records that could not be read (never replayed, nothing forwarded), by reason: corrupt, tampered, unknown_key, unsealed, no_keys, too_large (a streamed answer longer than its route's max_response_body).",
		}, []string{"reason"}),
		streamChunks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_stream_chunks_total",
			Help: "Chunks of streamed answers (routes[].stream) stored before their client got them, by route.",
		}, []string{"route"}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_store_wakeups_total",
			Help: "Times a waiter (concurrent: wait, a stream's follower) looked at its key, by how it was woken: notify (the store said the key changed: Redis keyspace events, PostgreSQL LISTEN/NOTIFY) or poll (its safety-net timer). Polls alone mean wake-ups are not arriving (PostgreSQL: LISTEN behind a transaction pooler; set store.postgres.listen_url).",
		}, []string{"how"}),
		streamAttached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_stream_attached_total",
			Help: "Retries that attached to a streamed answer still running and followed it live, by route.",
		}, []string{"route"}),
		streamLagging: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_stream_lagging_clients_total",
			Help: "First attempts' clients that fell more than 1 MiB behind their streamed answer and read the rest of it from the store (the upstream is never held back for them), by route.",
		}, []string{"route"}),
		streamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_stream_ends_total",
			Help: "Streamed answers that ended, by route and end: ended (normally, stored whole), aborted (broken off: the upstream reset, a chunk could not be stored, the owner's lease was lost; every reader gets the stored prefix and an abnormal end), too_large (past max_response_body: not replayable).",
		}, []string{"route", "end"}),
		streamFirstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_stream_first_byte_seconds",
			Help:    "Time from a streamed answer's request arriving to its first chunk stored (and sent), by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_reconciled_total",
			Help: "Reconcile lookups (routes[].reconcile) by route and result: found (the upstream's answer stored), absent (the key freed), too_early (absent before absent_after), unresolved (the answer stays outcome-unknown).",
		}, []string{"route", "result"}),
		authorizations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_replay_authorizations_total",
			Help: "Replay authorizations (replay.authorize_url) by route and result (allowed, forbidden, unavailable).",
		}, []string{"route", "result"}),
		authorizeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemproxy_replay_authorize_seconds",
			Help:    "Latency of replay authorizations.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		unconfirmed: newUnconfirmedCounter(),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_webhook_deliveries_total",
			Help: "Webhook deliveries on routes with a webhook block, by route and result: executed (the first delivery, forwarded), replayed (a redelivery answered from the record), in_progress, signature_invalid (missing, wrong or stale: nothing claimed or forwarded), refused.",
		}, []string{"route", "result"}),
		firstSentRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_first_sent_refused_total",
			Help: "New claims refused 412 (nothing forwarded) because the request was first sent longer ago than the retention (key-expired) or before the store lost its data (record-lost), by route and reason.",
		}, []string{"route", "reason"}),
		passThrough: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_passthrough_requests_total",
			Help: "Requests no route protects, forwarded as they are, by the class of their answer (1xx to 5xx; 4xx includes 499: the client went away before an answer). With the app down, 5xx.",
		}, []string{"class"}),
		retention: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemproxy_route_retention_seconds",
			Help: "The route's retention: how long a settled answer is kept. new keys/s x this is the records the route holds in Redis (idemproxy:store_expected_records).",
		}, []string{"route"}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_overloaded_total",
			Help: "First attempts answered 503 overloaded (claim released, nothing forwarded), by route and reason: process_cap (the route forwards max_in_flight requests in this process already), principal_share (this principal holds its max_in_flight_principal_share), reserved (the last share is kept for principals that hold none).",
		}, []string{"route", "reason"}),
		lateRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_late_calls_refused_total",
			Help: "Upstream calls cancelled at upstream.timeout for want of a late-call slot, by route and reason (process_cap: upstream.max_late_calls; principal_share: the principal's upstream.late_calls_principal_share; reserved: the last share is kept for principals that hold none).",
		}, []string{"route", "reason"}),
		unknownOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_unknown_outcomes_total",
			Help: "Protected requests the upstream may have acted on without an answer, by route and handling (keep, release, fail, or orphan: an owner vanished and a later attempt settled its claim).",
		}, []string{"route", "handling"}),
	}
	m.initSeries()
	if reg != nil {
		gauge := func(name, help string, read func(g gaugeState) float64) prometheus.Collector {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
				if g := m.state.Load(); g != nil {
					return read(*g)
				}
				return 0
			})
		}
		reg.MustRegister(m.requests, m.storeSeconds, m.storeErrors, m.upstream, m.added, m.storedBytes, m.renewals,
			m.lateAnswers, m.lateCalls, m.lateRefused, m.overloaded, m.retention, m.unknownOutcomes, m.unconfirmed, m.passThrough, m.firstSentRefused, m.webhooks, m.reconciled, m.streamChunks, m.streamAttached, m.wakeups, m.streamLagging, m.streamEnds, m.streamFirstByte, m.authorizations, m.authorizeSeconds, m.recordErrors, m.quotaRefusals,
			gauge("idemproxy_inflight_claims", "Claims this process owns and has not settled yet.",
				func(g gaugeState) float64 { return g.inflight() }),
			gauge("idemproxy_oldest_inflight_claim_seconds", "Age of the oldest claim this process owns and has not settled; 0 when none.",
				func(g gaugeState) float64 { return g.oldest() }),
			gauge("idemproxy_buffered_bytes", "Bytes held in request and response body buffers now; limits.max_buffered_bytes bounds it.",
				func(g gaugeState) float64 { return float64(g.buffered()) }),
			gauge("idemproxy_waiting_retries", "Retries waiting now for a first attempt's outcome (concurrent: wait).",
				func(g gaugeState) float64 { return float64(g.waiting()) }),
			gauge("idemproxy_unconfirmed_claims_pending", "Claims whose reply never came that this process is still cleaning up (idemproxy_unconfirmed_claims_total counts how each ended).",
				func(g gaugeState) float64 { return float64(g.pending()) }))
	}
	return m
}

// storeTime is storeSeconds' series of store operation op.
func (m *Metrics) storeTime(op string) prometheus.Observer {
	if o, ok := m.storeTimes[op]; ok {
		return o
	}
	return m.storeSeconds.WithLabelValues(op)
}

// gaugeState is what the gauges read: the state of the Handler New built
// last.
type gaugeState struct {
	inflight, oldest func() float64
	buffered         func() int64
	waiting, pending func() int
}

// initSeries creates the series that do not depend on routes at zero:
// series that exist from the start make rate() and absent-based alerts
// work before the first error.
func (m *Metrics) initSeries() {
	m.storeTimes = make(map[string]prometheus.Observer, len(storeOps))
	for _, s := range storeOps {
		m.storeErrors.WithLabelValues(s)
		m.storeTimes[s] = m.storeSeconds.WithLabelValues(s)
	}
	for _, r := range []string{"ok", "lost", "error"} {
		m.renewals.WithLabelValues(r)
	}
	for _, r := range unconfirmedResults {
		m.unconfirmed.WithLabelValues(r)
	}
	for _, r := range []string{claim.ReasonCorrupt, claim.ReasonTampered, claim.ReasonUnknownKey, claim.ReasonUnsealed, claim.ReasonNoKeys, claim.ReasonTooLarge} {
		m.recordErrors.WithLabelValues(r)
	}
	m.wakeupNotify, m.wakeupPoll = m.wakeups.WithLabelValues("notify"), m.wakeups.WithLabelValues("poll")
	for c := 1; c <= 5; c++ {
		m.passThroughClass[c] = m.passThrough.WithLabelValues(strconv.Itoa(c) + "xx")
	}
}

// initRoute creates at zero the series a route's settings can move, so
// that an alert's increase() sees the first event after a start (a
// counter born at its first increment starts from that value).
func (m *Metrics) initRoute(name string, s *Route) {
	m.unknownOutcomes.WithLabelValues(name, s.Unknown.String())
	m.unknownOutcomes.WithLabelValues(name, unknownOrphan)
	if s.Stream {
		m.streamChunks.WithLabelValues(name)
		m.streamAttached.WithLabelValues(name)
		m.streamLagging.WithLabelValues(name)
		for _, end := range []string{"ended", "aborted", "too_large"} {
			m.streamEnds.WithLabelValues(name, end)
		}
	}
	if s.Webhook != nil {
		for _, r := range []string{webhookExecuted, webhookReplayed, webhookInProgress, webhookSigInvalid, webhookRefused} {
			m.webhooks.WithLabelValues(name, r)
		}
	}
}

// initRoutes creates every route's outcome series at zero.
func (m *Metrics) initRoutes(rt *router) {
	m.retention.Reset() // a route removed by a reload holds nothing new
	for name, d := range rt.retention {
		m.retention.WithLabelValues(name).Set(d.Seconds())
	}
	for _, name := range rt.names {
		for _, o := range outcomes {
			m.requests.WithLabelValues(name, o)
		}
		for _, r := range lateResults {
			m.lateAnswers.WithLabelValues(name, r)
		}
		if rt.reconciles[name] {
			for _, r := range reconcileResults {
				m.reconciled.WithLabelValues(name, r)
			}
		}
		for _, r := range []string{refusedKeyExpired, refusedRecordLost} {
			m.firstSentRefused.WithLabelValues(name, r)
		}
		m.initRoute(name, &rt.byName[name].settings)
		for _, r := range []string{refusedCap, refusedShare, refusedReserved} {
			m.lateRefused.WithLabelValues(name, r)
			m.overloaded.WithLabelValues(name, r)
		}
	}
}

// The results of one lookup, the values of the result label of
// idemproxy_reconciled_total; tooEarly is decided by the store, after an
// absent answer.
const (
	lookupFound      = "found"
	lookupAbsent     = "absent"
	lookupTooEarly   = "too_early"
	lookupUnresolved = "unresolved"
)

// reconcileResults are the values of idemproxy_reconciled_total's result.
var reconcileResults = []string{lookupFound, lookupAbsent, lookupTooEarly, lookupUnresolved}

func newUnconfirmedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_unconfirmed_claims_total",
		Help: "Claims whose reply never came (their SET may have run late), by how they were cleaned up: released, not_found, gave_up, cleared_on_retry.",
	}, []string{"result"})
}
