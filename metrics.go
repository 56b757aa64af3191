package main

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the main package's collectors, beside the proxy's own, all
// on one registry that /metrics serves.
type metrics struct {
	reg *prometheus.Registry
	// waitShort counts claims and completions that fewer replicas than
	// store.wait_replicas acknowledged in time.
	waitShort *prometheus.CounterVec
	// evictionSafe says whether Redis' maxmemory-policy keeps claims.
	evictionSafe prometheus.Gauge
	// reloads counts config reloads by result; reloadOK says whether the
	// last one succeeded.
	reloads  *prometheus.CounterVec
	reloadOK prometheus.Gauge
	// memoryUsed is Redis' used_memory over maxmemory; storeFull is 1
	// while new claims are refused for store.claim_memory_limit.
	memoryUsed, storeFull prometheus.Gauge
	// storeUp is 1 per master that answered the store watcher's last
	// look, 0 per master that did not.
	storeUp *prometheus.GaugeVec
	// schemaReady is 1 once the store's scripts or schema are in place
	// (Preload succeeded), 0 while not.
	schemaReady prometheus.Gauge
	// clockOffset is each node's clock minus this process', from the
	// store watcher's last reading of it.
	clockOffset *prometheus.GaugeVec
	// upstreamUp is the app's health (apphealth.go), registered only with
	// upstream.health_path.
	upstreamUp prometheus.Gauge
	// dataLost counts epoch markers found gone, by master.
	dataLost *prometheus.CounterVec
	// storeKeys and storeBytes are each master's size, from the same look.
	storeKeys, storeBytes *prometheus.GaugeVec
	// size is each master's bytes under one name for both stores.
	size *prometheus.GaugeVec
	// expired, cleanupLag and oldestClaim are a store's cleanup, when it
	// deletes expired records itself (PostgreSQL: claim.Cleanup).
	expired, cleanupLag, oldestClaim *prometheus.GaugeVec
	// batchOps observes how many operations each store pipeline carried
	// (store.pipeline).
	batchOps prometheus.Histogram
}

// newMetrics registers the process, Go runtime and main package collectors
// on a new registry. With waitReplicas the wait_short series start at 0.
func newMetrics(waitReplicas bool) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		waitShort: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_store_wait_short_total",
			Help: "Claims and completions that fewer than store.wait_replicas replicas acknowledged within store.wait_timeout, by op.",
		}, []string{"op"}),
		evictionSafe: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_redis_eviction_policy_safe",
			Help: "1 when Redis' maxmemory-policy is noeviction, 0 when it can evict idempotency keys, -1 when unknown.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_config_reloads_total",
			Help: "Config reload attempts by result (ok, error).",
		}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_config_last_reload_successful",
			Help: "1 when the last config reload attempt succeeded (or none was made), 0 when the file on disk is rejected.",
		}),
	}
	m.storeGauges()
	if waitReplicas {
		m.waitShort.WithLabelValues("claim")
		m.waitShort.WithLabelValues("complete")
	}
	m.reloadOK.Set(1)
	v, rev, gov := buildLabels()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_build_info",
		Help: "Always 1; its labels say which build runs: version (CHANGELOG.md's, or the -X main.version stamp), revision (the VCS commit) and goversion.",
	}, []string{"version", "revision", "goversion"})
	build.WithLabelValues(v, rev, gov).Set(1)
	m.reg.MustRegister(build)
	m.reg.MustRegister(m.dataLost)
	m.clockOffset = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_clock_offset_seconds",
		Help: "The store's clock minus this sidecar's, per node (a Redis master, the PostgreSQL server), as the store watcher's round trip measures it every second (to within half that round trip). Beyond 0.5 s either way a claim is written unmarked (a retry cannot free it as never forwarded) and reconcile cannot free an absent key: the 409s' detail then names the offset. IdemproxyStoreClockOffset pages above 0.4 s.",
	}, []string{"node"})
	m.reg.MustRegister(m.clockOffset)
	m.schemaReady = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_store_schema_ready",
		Help: "1 once the store's scripts (Redis) or schema (PostgreSQL: installed with create_schema, or found at this release's version) are in place, 0 while not: the store is unreachable, the role may not install the schema, or it was never migrated. The log says why, once.",
	})
	m.reg.MustRegister(m.schemaReady)
	m.reg.MustRegister(m.waitShort, m.evictionSafe, m.reloads, m.reloadOK, m.memoryUsed, m.storeFull, m.storeUp, m.storeKeys, m.storeBytes, m.size, m.expired, m.cleanupLag, m.oldestClaim, m.batchOps,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// storeGauges makes what the store watcher and the app probe set: the
// store's memory, fullness, keys, bytes, loss and pipelines, and the
// app's health.
func (m *metrics) storeGauges() {
	m.memoryUsed = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_redis_memory_used_ratio",
		Help: "Redis used_memory over maxmemory (the fullest master on a Cluster); 0 without a maxmemory.",
	})
	m.storeFull = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_store_full",
		Help: "1 while new claims are refused (503 store-full) because Redis is above store.claim_memory_limit.",
	})
	m.upstreamUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemproxy_upstream_up",
		Help: "1 when the app answered its health path (upstream.health_path) with 2xx or 3xx at the last probe (every 5s, and every /app/readyz), 0 when not; absent without a health path.",
	})
	m.dataLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_store_data_lost_total",
		Help: "Times this process found the store lost its data: a Redis master's (or the PostgreSQL store's) epoch marker gone after it had seen it (a restart without persistence, a flush, a truncation), or on PostgreSQL a server that can have lost acknowledged writes (another system identifier; a new timeline after asynchronous replication); a new epoch began, and requests first sent before it are refused 412 record-lost.",
	}, []string{"master"})
	m.storeUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_up",
		Help: "1 when the Redis master answered the store watcher's last look (every second), 0 when not; one series per master (the address, or the Sentinel master name).",
	}, []string{"master"})
	m.storeKeys = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_keys",
		Help: "Keys the Redis master holds (INFO keyspace, every database), or the PostgreSQL store's estimated rows (pg_class.reltuples), read by the store watcher every second; one series per master. Records held should stay near new keys/s x retention (idemproxy:store_expected_records). On a Redis shared with other applications it counts theirs too.",
	}, []string{"master"})
	m.storeBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_used_bytes",
		Help: "used_memory of the Redis master, or the PostgreSQL store's records table with its indexes and TOAST (pg_total_relation_size), read by the store watcher every second; one series per master.",
	}, []string{"master"})
	m.size = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_bytes",
		Help: "The store's size, one series per master: Redis' used_memory, or the PostgreSQL records table with its indexes and TOAST (the same figure as idemproxy_store_used_bytes, under one name for both stores).",
	}, []string{"master"})
	m.expired = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_expired_records",
		Help: "PostgreSQL store: expired records not deleted yet (reads ignore them; the store watcher deletes up to 5,000 a second by the expiry index), counted up to 10,000 (beyond, the cleanup lags: idemproxy_store_cleanup_lag_seconds says how far; counting a backlog of a million cost each pod 60-70 ms of the database a second).",
	}, []string{"master"})
	m.cleanupLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_cleanup_lag_seconds",
		Help: "PostgreSQL store: how long ago the oldest expired record not deleted yet expired; 0 when cleanup keeps up.",
	}, []string{"master"})
	m.oldestClaim = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemproxy_store_oldest_claim_seconds",
		Help: "PostgreSQL store: the age of the oldest claim in progress (its Created time against the database's clock), found by the partial index on claims; 0 when none.",
	}, []string{"master"})
	m.batchOps = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "idemproxy_store_pipeline_operations",
		Help:    "Store operations coalesced into each pipeline sent to Redis, or each batch PostgreSQL commits together (store.pipeline); 1 when nothing waited to go with it.",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
	})
}

// poolStats exposes the PostgreSQL store's connection pool, read from
// stat at each scrape: its connections by state, and how often and how
// long an operation waited for one (a pool too small for the load, or a
// database that holds its connections).
func (m *metrics) poolStats(stat func() *pgxpool.Stat) {
	conns := func(state string, read func(*pgxpool.Stat) int32) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "idemproxy_store_pool_connections",
			Help:        "The PostgreSQL store's pooled connections by state: acquired (running an operation) or idle; their sum is at most store.postgres.max_conns, plus the LISTEN connection (always acquired) when store.postgres.listen_url is unset.",
			ConstLabels: prometheus.Labels{"state": state},
		}, func() float64 { return float64(read(stat())) })
	}
	m.reg.MustRegister(
		conns("acquired", (*pgxpool.Stat).AcquiredConns),
		conns("idle", (*pgxpool.Stat).IdleConns),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_store_pool_acquire_waits_total",
			Help: "Operations that found no idle connection in the PostgreSQL store's pool and waited for one (or for a new one to be dialed); alert IdemproxyStorePoolWaiting.",
		}, func() float64 { return float64(stat().EmptyAcquireCount()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "idemproxy_store_pool_acquire_wait_seconds_total",
			Help: "Time operations spent acquiring a connection from the PostgreSQL store's pool, all together (divide its rate by the waits' for the mean wait).",
		}, func() float64 { return stat().AcquireDuration().Seconds() }),
	)
}
