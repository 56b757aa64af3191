package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestDefaultUnknownOutcomeIsFail: with no unknown_outcome anywhere in the
// config, an upstream that acts and then resets the connection (the
// request was written, no answer came) leaves the key settled as 502
// outcome-unknown, which every retry gets; the upstream executed once.
// Under v0.3.0's default (keep) the retry executed again.
func TestDefaultUnknownOutcomeIsFail(t *testing.T) {
	var executed atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		executed.Add(1) // acted, then the connection breaks
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer upstream.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream.URL
	cfg.Store.Redis.Addrs = []string{redistest.Start(t).Addr}
	cfg.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}}
	if cfg.Routes[0].Settings.UnknownOutcome != config.OutcomeFail {
		t.Fatalf("default unknown_outcome = %q, want fail", cfg.Routes[0].Settings.UnknownOutcome)
	}
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	status, body := pay(t, s.clientAddr, "reset")
	if status != http.StatusBadGateway || !strings.Contains(body, "outcome-unknown") {
		t.Fatalf("first attempt: %d %s, want 502 outcome-unknown", status, body)
	}
	for range 3 {
		if again, body2 := pay(t, s.clientAddr, "reset"); again != http.StatusBadGateway || !strings.Contains(body2, "outcome-unknown") {
			t.Fatalf("retry: %d %s, want the stored 502 outcome-unknown", again, body2)
		}
	}
	if n := executed.Load(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}
