package proxy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/proxy"
)

// observedEnv runs one request of each deterministic outcome.
func observedEnv(t *testing.T) *env {
	busy := true
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "busy" && busy {
			busy = false
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		created(w, r)
	}, func(c *setup) {
		c.Routes = append(c.Routes, route("opt", "POST /optional"))
		c.Routes[1].RequireKey = false
	})
	e.do(req{user: "alice", key: "k", body: `{"card":"tok_visa_secret"}`})           // stored
	e.do(req{user: "alice", key: "k", body: `{"card":"tok_visa_secret"}`})           // replayed
	e.do(req{user: "alice", key: "k", body: `{"card":"tok_mc_secret"}`})             // mismatch
	e.do(req{user: "alice", body: `{}`})                                             // rejected
	e.do(req{user: "alice", key: "busy", body: `{}`})                                // released
	e.do(req{path: "/optional", user: "alice", body: `{}`})                          // bypassed
	e.do(req{method: http.MethodGet, path: "/unprotected", user: "alice", body: ``}) // not counted
	e.quiesce()
	return e
}

// TestMetricsExposition compares the request and claim metrics with a
// golden file. Set IDEMPROXY_UPDATE_GOLDEN=1 to rewrite it.
func TestMetricsExposition(t *testing.T) {
	e := observedEnv(t)
	names := []string{"idemproxy_requests_total", "idemproxy_inflight_claims", "idemproxy_store_errors_total", "idemproxy_route_retention_seconds", "idemproxy_overloaded_total"}
	golden := "testdata/metrics.golden"
	if os.Getenv("IDEMPROXY_UPDATE_GOLDEN") == "1" {
		writeGolden(t, e, golden, names)
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(e.reg, f, names...); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"idemproxy_store_operation_seconds", "idemproxy_upstream_seconds", "idemproxy_added_latency_seconds", "idemproxy_stored_response_bytes"} {
		if c, err := testutil.GatherAndCount(e.reg, n); err != nil || c == 0 {
			t.Errorf("%s: %d series, %v; want it exposed", n, c, err)
		}
	}
}

// TestLogLines: one JSON line per protected request, with route, outcome,
// status, request id and the hashed key; never the raw key, principal or
// body.
func TestLogLines(t *testing.T) {
	e := observedEnv(t)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 6 {
		t.Fatalf("%d request log lines, want 6 (one per protected request)", len(lines))
	}
	for _, m := range lines {
		for _, k := range []string{"route", "outcome", "status", "request_id", "duration"} {
			if _, ok := m[k]; !ok {
				t.Errorf("log line %v lacks %s", m, k)
			}
		}
	}
	if k, _ := lines[0]["key"].(string); !strings.HasPrefix(k, "idem:") || len(k) != len("idem:")+64 {
		t.Errorf("first line's key = %q, want the hashed Redis key", k)
	}
	if lines[1]["outcome"] != "replayed" || lines[1]["original_request_id"] != lines[0]["request_id"] || lines[1]["request_id"] == lines[0]["request_id"] {
		t.Errorf("the replay's log line must name the original request: %v then %v", lines[0], lines[1])
	}
	all := e.logs.String()
	for _, secret := range []string{`"k"`, "alice", "tok_visa_secret", "tok_mc_secret"} {
		if strings.Contains(all, secret) {
			t.Errorf("logs contain %s", secret)
		}
	}
}

func writeGolden(t *testing.T, e *env, path string, names []string) {
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if slices.Contains(names, mf.GetName()) {
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOldestInflightClaimAge(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		created(w, r)
	}, nil)
	gauge := func() float64 {
		mfs, err := e.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "idemproxy_oldest_inflight_claim_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("idemproxy_oldest_inflight_claim_seconds not exposed")
		return 0
	}
	if g := gauge(); g != 0 {
		t.Fatalf("with no claims the age is %v, want 0", g)
	}
	done := make(chan resp)
	go func() { done <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the claim ages", func() bool { return gauge() >= 0.1 })
	close(release)
	<-done
	// The client may see the answer a moment before the handler returns.
	poll.Until(t, "the settled claim is no longer counted", func() bool { return gauge() == 0 })
}

// BenchmarkFirstAttempt is one protected request end to end: client,
// proxy, real Redis (claim + complete), httptest upstream.
func BenchmarkFirstAttempt(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchFirstAttempt(b, nil) })
	b.Run("sealed", func(b *testing.B) { benchFirstAttempt(b, sealing(b)) })
	// Traced: every span recorded and sampled, handed to no exporter.
	b.Run("traced", func(b *testing.B) {
		benchFirstAttempt(b, func(c *setup) { c.TracerProvider = sdktrace.NewTracerProvider() })
	})
}

// BenchmarkFirstAttemptPhases is where one first attempt's time goes, at
// one connection: the spans of every request (tracing on) give the time in
// the claim, the upstream call and the completion; the rest of the server
// span is idemproxy's own work, and what the client measures beyond the
// server span is the client and the hop. Each is reported in µs per request.
func BenchmarkFirstAttemptPhases(b *testing.B) {
	spans := tracetest.NewSpanRecorder()
	e := newEnv(b, created, func(c *setup) {
		c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	})
	i := 0
	start := time.Now()
	for b.Loop() {
		i++
		if r := e.do(req{user: "alice", key: "k" + strconv.Itoa(i), body: `{"amount":1}`}); r.status != http.StatusCreated {
			b.Fatal(r.status)
		}
	}
	total := time.Since(start)
	sum := map[string]time.Duration{}
	for _, s := range spans.Ended() {
		sum[s.Name()] += s.EndTime().Sub(s.StartTime())
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(i) }
	server := sum["idempotent pay"]
	b.ReportMetric(per(sum["redis claim"]), "claim-µs")
	b.ReportMetric(per(sum["upstream POST"]), "upstream-µs")
	b.ReportMetric(per(sum["redis complete"]), "complete-µs")
	b.ReportMetric(per(server-sum["redis claim"]-sum["upstream POST"]-sum["redis complete"]), "proxy-µs")
	b.ReportMetric(per(total-server), "client+hop-µs")
}

// sealing is a store option sealing records with a fresh key.
func sealing(b *testing.B) func(*setup) {
	key := make([]byte, claim.KeySize)
	rand.Read(key)
	opt, err := claim.WithSealing([][]byte{key}, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	return func(c *setup) { c.StoreOptions = []claim.Option{opt} }
}

func benchFirstAttempt(b *testing.B, mutate func(*setup)) {
	e := newEnv(b, created, mutate)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if r := e.do(req{user: "alice", key: "k" + strconv.Itoa(i), body: `{"amount":1}`}); r.status != http.StatusCreated {
			b.Fatal(r.status)
		}
	}
}

// BenchmarkReplay is one retry answered from Redis end to end.
func BenchmarkReplay(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchReplay(b, nil) })
	b.Run("sealed", func(b *testing.B) { benchReplay(b, sealing(b)) })
}

func benchReplay(b *testing.B, mutate func(*setup)) {
	e := newEnv(b, created, mutate)
	e.do(req{user: "alice", key: "k", body: `{"amount":1}`})
	b.ReportAllocs()
	for b.Loop() {
		if r := e.do(req{user: "alice", key: "k", body: `{"amount":1}`}); r.header.Get("Idempotent-Replayed") != "true" {
			b.Fatal(r.status)
		}
	}
}

// A client that gives up while waiting for the first attempt is not a
// store error: the store-errors alert must not fire on impatient clients.
func TestClientLeavingWaitIsNotAStoreError(t *testing.T) {
	e := newEnv(t, slow(500*time.Millisecond, created), func(c *setup) {
		c.Routes[0].Wait = true
		c.Routes[0].MaxWait = 5 * time.Second
	})
	first := make(chan resp)
	go func() { first <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := e.try(ctx, req{user: "alice", key: "k", body: `{}`}); err == nil {
		t.Fatal("the waiting client should have given up")
	}
	<-first
	e.quiesce()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "idemproxy_store_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("idemproxy_store_errors_total%v = %v, want 0", m.GetLabel(), v)
			}
		}
	}
}

// Request ids come from Options.Rand: a fixed source gives a fixed id,
// which the problem body and the upstream both see.
func TestRequestIDFromInjectedRand(t *testing.T) {
	cfg := proxy.TestConfig("http://127.0.0.1:1")
	cfg.Routes = []proxy.Route{route("pay", "POST /payments")}
	h, err := proxy.New(cfg, nil, proxy.Options{Rand: bytes.NewReader(bytes.Repeat([]byte{0xab}, 16))})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader("{}"))
	r.RemoteAddr = "127.0.0.1:5000"
	r.Header.Set("X-Forwarded-User", "alice")
	h.ServeHTTP(w, r) // no key: 400, nothing stored, no store needed
	want := strings.Repeat("ab", 16)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"request_id":"`+want+`"`) {
		t.Fatalf("got %d %s, want 400 with request_id %s", w.Code, w.Body.String(), want)
	}
}
