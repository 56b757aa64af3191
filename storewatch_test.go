package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// storeUp reads idemproxy_store_up (internal/binarytest).
var storeUp = binarytest.StoreUp

// TestStoreFullKeepsRoomForCompletions: once Redis is above
// store.claim_memory_limit, new claims get 503 store-full and nothing is
// forwarded, while a request already in flight still stores its answer and
// is replayed (issue 13: another principal filling Redis must not turn an
// in-flight payment into a retry that executes again).
func TestStoreFullKeepsRoomForCompletions(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	release := make(chan struct{})
	var arrived, calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("Idempotency-Key") == "inflight" {
			arrived.Add(1)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged "+r.Header.Get("Idempotency-Key"))
	}))
	defer upstream.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	cfg := lateConfig(srv, upstream.URL)
	cfg.Upstream.Timeout = 30 * time.Second
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	type result struct {
		status int
		body   string
	}
	inflight := make(chan result, 1)
	go func() {
		st, b := pay(t, s.clientAddr, "inflight")
		inflight <- result{st, b}
	}()
	poll.Until(t, "the in-flight request reaches the upstream", func() bool { return arrived.Load() == 1 })

	rdb := srv.Client()
	ctx := context.Background()
	filler := strings.Repeat("x", 100<<10)
	for i := 0; ; i++ {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		var used, limit float64
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				used, _ = strconv.ParseFloat(v, 64)
			}
			if v, ok := strings.CutPrefix(line, "maxmemory:"); ok {
				limit, _ = strconv.ParseFloat(v, 64)
			}
		}
		if used/limit >= 0.93 {
			break
		}
		if i > 200 {
			t.Fatalf("could not fill Redis: %.0f of %.0f bytes", used, limit)
		}
		if err := rdb.Set(ctx, fmt.Sprintf("filler:%d", i), filler, 0).Err(); err != nil {
			t.Fatalf("fill: %v", err)
		}
	}
	n := 0
	poll.Until(t, "new claims are refused with 503 store-full", func() bool {
		n++
		status, body := pay(t, s.clientAddr, fmt.Sprintf("fresh-%d", n))
		return status == http.StatusServiceUnavailable && strings.Contains(body, "store-full")
	})
	before := calls.Load()
	if status, body := pay(t, s.clientAddr, "fresh-again"); status != http.StatusServiceUnavailable || calls.Load() != before {
		t.Fatalf("a new claim while full: %d %s, forwarded %d; want 503 store-full and nothing forwarded", status, body, calls.Load()-before)
	}
	close(release)
	if r := <-inflight; r.status != http.StatusCreated || r.body != "charged inflight" {
		t.Fatalf("the in-flight request: %d %q, want its 201", r.status, r.body)
	}
	if status, body := pay(t, s.clientAddr, "inflight"); status != http.StatusCreated || body != "charged inflight" {
		t.Fatalf("its retry while full: %d %q, want the stored answer replayed", status, body)
	}
	if got := arrived.Load(); got != 1 {
		t.Fatalf("the in-flight request executed %d times, want 1", got)
	}
}

// The store's and the waiters' metrics are on /metrics: pipelines sent
// (each store operation went in one) and retries waiting now.
func TestStoreAndWaiterMetrics(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	defer upstream.Close()
	cfg := lateConfig(redistest.Start(t), upstream.URL)
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	if status, _ := pay(t, s.clientAddr, "k1"); status != http.StatusCreated {
		t.Fatalf("first attempt: %d", status)
	}
	body := scrape(t, "http://"+s.adminAddr)
	for _, want := range []string{"idemproxy_waiting_retries 0", "idemproxy_store_pipeline_operations_count "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "idemproxy_store_pipeline_operations_count 0\n") {
		t.Error("no store pipeline was counted for a claim and a completion")
	}
}

// The store's size per master and each route's retention (issue 23): the
// gauges behind the expected-size recording rule and IdemproxyStoreGrowing.
// idemproxy_store_keys is the master's key count, read on the watcher's
// tick; a route's retention is its setting in seconds.
func TestStoreSizeMetrics(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	defer upstream.Close()
	srv := redistest.Start(t)
	cfg := lateConfig(srv, upstream.URL)
	cfg.Routes[0].Settings.Retention = 2 * time.Hour
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	for i := range 7 {
		if status, _ := pay(t, s.clientAddr, fmt.Sprintf("size-%d", i)); status != http.StatusCreated {
			t.Fatalf("first attempt %d: %d", i, status)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	keys, err := rdb.DBSize(context.Background()).Result()
	if err != nil || keys < 7 {
		t.Fatalf("DBSIZE %d %v, want at least the 7 records", keys, err)
	}
	want := []string{
		fmt.Sprintf("idemproxy_store_keys{master=%q} %d\n", srv.Addr, keys),
		`idemproxy_route_retention_seconds{route="pay"} 7200` + "\n",
		fmt.Sprintf("idemproxy_store_used_bytes{master=%q} ", srv.Addr),
	}
	poll.Until(t, "the store watcher's next look", func() bool {
		for _, w := range want {
			if !metric(t, "http://"+s.adminAddr, w) {
				return false
			}
		}
		return true
	})
}

// TestStoreSizeAndCleanupGauges (issue 56): idemproxy_store_bytes carries
// every store's size under one name, and the cleanup gauges are set only
// for a store that reports its cleanup (the PostgreSQL store).
func TestStoreSizeAndCleanupGauges(t *testing.T) {
	m := newMetrics(false)
	setCleanup(m, []claim.MasterHealth{
		{Master: "redis-0:6379", Sized: true, UsedBytes: 1 << 20},
		{Master: "db:5432", Sized: true, UsedBytes: 3 << 20, Cleanup: &claim.Cleanup{Expired: 7, Lag: 90 * time.Second, OldestClaim: 2 * time.Second}},
	})
	if v := testutil.ToFloat64(m.size.WithLabelValues("redis-0:6379")); v != 1<<20 {
		t.Errorf("idemproxy_store_bytes for Redis = %v", v)
	}
	if v := testutil.ToFloat64(m.size.WithLabelValues("db:5432")); v != 3<<20 {
		t.Errorf("idemproxy_store_bytes for PostgreSQL = %v", v)
	}
	if v := testutil.ToFloat64(m.cleanupLag.WithLabelValues("db:5432")); v != 90 {
		t.Errorf("cleanup lag = %v, want 90", v)
	}
	if n := testutil.CollectAndCount(m.cleanupLag); n != 1 {
		t.Errorf("cleanup lag series = %d, want 1 (none for Redis)", n)
	}
}
