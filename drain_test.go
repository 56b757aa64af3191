package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestDrainStoresInFlightRequest cancels serve (as SIGTERM does) while a
// protected request is upstream: the request completes and its response is
// stored before serve returns.
func TestDrainStoresInFlightRequest(t *testing.T) {
	srv := redistest.Start(t)
	var arrived atomic.Bool
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Store(true)
		time.Sleep(500 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	defer upstream.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream.URL
	cfg.Upstream.Timeout = 5 * time.Second
	cfg.Store.Redis.Addrs = []string{srv.Addr}
	cfg.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}}

	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	addr := s.clientAddr
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(binarytest.PayRequest("http://"+addr+"/payments", "drain-1", "{}"))
		if err != nil {
			done <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{status: resp.StatusCode, body: string(b)}
	}()
	for !arrived.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // SIGTERM
	r := <-done
	if r.err != nil || r.status != http.StatusCreated || r.body != "charged" {
		t.Fatalf("in-flight request during drain: %d %q %v", r.status, r.body, r.err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("serve: %v", err)
	}
	store := redisstore.New(srv.Client(), cfg.Store.KeyPrefix)
	rec, _, err := store.Get(context.Background(), store.Codec().Key("alice", proxy.KeyScope("pay", false), "drain-1"))
	if err != nil || rec == nil || rec.State != claim.Completed || string(rec.Body) != "charged" {
		t.Fatalf("stored record after drain: %+v, %v", rec, err)
	}
}

func lateConfig(srv *redistest.Server, upstream string) *config.Config {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream
	cfg.Upstream.Timeout = time.Second
	cfg.Store.Redis.Addrs = []string{srv.Addr}
	cfg.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}}
	return cfg
}

// TestDrainStoresLateAnswer: SIGTERM while a call runs past
// upstream.timeout (its client already got 504) waits for it, within
// drain.timeout, and stores its late answer before serve returns.
func TestDrainStoresLateAnswer(t *testing.T) {
	srv := redistest.Start(t)
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged late")
	}))
	defer upstream.Close()
	cfg := lateConfig(srv, upstream.URL)
	cfg.Drain.Timeout = 10 * time.Second
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	addr := s.clientAddr
	if status, body := pay(t, addr, "late-1"); status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d %s, want 504", status, body)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // SIGTERM
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("serve returned (%v) while a late call was running", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("serve: %v", err)
	}
	store := redisstore.New(srv.Client(), cfg.Store.KeyPrefix)
	rec, _, err := store.Get(context.Background(), store.Codec().Key("alice", proxy.KeyScope("pay", false), "late-1"))
	if err != nil || rec == nil || rec.State != claim.Completed || string(rec.Body) != "charged late" {
		t.Fatalf("stored record after drain: %+v, %v; want the late answer", rec, err)
	}
}

// TestDrainTimeoutSettlesLateCalls: a late call still running when
// drain.timeout runs out is cancelled and settled by unknown_outcome (fail:
// a stored outcome-unknown), not left in progress by the exit.
func TestDrainTimeoutSettlesLateCalls(t *testing.T) {
	srv := redistest.Start(t)
	var cancelled atomic.Bool
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // net/http watches for a closed connection only after the body
		<-r.Context().Done()
		cancelled.Store(true)
	}))
	defer upstream.Close()
	cfg := lateConfig(srv, upstream.URL)
	cfg.Drain.Timeout = 500 * time.Millisecond
	cfg.Routes[0].Settings.UnknownOutcome = config.OutcomeFail
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	addr := s.clientAddr
	if status, body := pay(t, addr, "late-2"); status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d %s, want 504", status, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	store := redisstore.New(srv.Client(), cfg.Store.KeyPrefix)
	rec, _, err := store.Get(context.Background(), store.Codec().Key("alice", proxy.KeyScope("pay", false), "late-2"))
	if err != nil || rec == nil || rec.State != claim.Completed || rec.Status != http.StatusBadGateway || !strings.Contains(string(rec.Body), "outcome-unknown") {
		t.Fatalf("record after the drain ran out: %+v, %v; want a stored 502 outcome-unknown", rec, err)
	}
	poll.Until(t, "the upstream call is cancelled", cancelled.Load)
}
