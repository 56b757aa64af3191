package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestMetricsPassPromtool lints a real scrape of /metrics, after protected
// requests of several outcomes, with `promtool check metrics` (naming,
// units, help). It skips without promtool unless
// IDEMPROXY_REQUIRE_PROMTOOL=1, which .ci/run sets.
func TestMetricsPassPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("IDEMPROXY_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool not in PATH and IDEMPROXY_REQUIRE_PROMTOOL=1: apt-get install prometheus")
		}
		t.Skip("promtool not in PATH (apt-get install prometheus)")
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream.URL
	cfg.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: cfg.Defaults}}
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	pay(t, s.clientAddr, "a")
	pay(t, s.clientAddr, "a")
	pay(t, s.clientAddr, "")
	resp, err := http.Get("http://" + s.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scrape, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = bytes.NewReader(scrape)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
