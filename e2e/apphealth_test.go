package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestAppReadinessThroughTheSidecar (issue 32), through the real binary:
// with upstream.health_path set, /app/readyz on the admin port answers
// for the app (the app container's readiness probe in the manifests), and
// the sidecar's own /readyz does not depend on it. App down: /app/readyz
// 503, idemproxy_upstream_up 0, /readyz 200; app back: 200 and 1. Before,
// nothing probed the app: with it down every request got 502 and the pod
// stayed Ready.
func TestAppReadinessThroughTheSidecar(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	app := func(ln net.Listener) *http.Server {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/healthz" {
				fmt.Fprintln(w, "ok")
				return
			}
			w.WriteHeader(http.StatusCreated)
		})}
		go srv.Serve(ln)
		return srv
	}
	srv := app(ln)
	defer func() { srv.Close() }()
	sc := startBinary(t, fmt.Sprintf(`upstream:
  url: "http://%s"
  health_path: /healthz
routes:
  - name: pay
    match: "POST /payments"
`, addr))
	up := func() string {
		for line := range strings.SplitSeq(scrape(t, sc.Admin), "\n") {
			if v, ok := strings.CutPrefix(line, "idemproxy_upstream_up "); ok {
				return v
			}
		}
		return "absent"
	}
	if status, body := get(t, sc.Admin+"/app/readyz"); status != http.StatusOK {
		t.Fatalf("/app/readyz with the app up: %d %s", status, body)
	}
	if v := up(); v != "1" {
		t.Errorf("idemproxy_upstream_up with the app up: %s, want 1", v)
	}

	srv.Close() // the app crashes
	if status, body := get(t, sc.Admin+"/app/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "did not answer") {
		t.Errorf("/app/readyz with the app down: %d %s, want 503 saying the app did not answer", status, body)
	}
	if status, _ := get(t, sc.Admin+"/readyz"); status != http.StatusOK {
		t.Errorf("the sidecar's own /readyz with the app down: %d, want 200 (it must not follow the app)", status)
	}
	if v := up(); v != "0" {
		t.Errorf("idemproxy_upstream_up with the app down: %s, want 0", v)
	}

	ln, err = net.Listen("tcp", addr) // the app comes back on its port
	if err != nil {
		t.Skipf("the app's port was taken meanwhile: %v", err)
	}
	srv = app(ln)
	poll.Until(t, "/app/readyz passes again", func() bool { status, _ := get(t, sc.Admin+"/app/readyz"); return status == http.StatusOK })
	if v := up(); v != "1" {
		t.Errorf("idemproxy_upstream_up with the app back: %s, want 1", v)
	}
}

// TestAppReadinessWithoutHealthPath: without upstream.health_path,
// /app/readyz says what to set (404) and idemproxy_upstream_up is absent.
func TestAppReadinessWithoutHealthPath(t *testing.T) {
	sc := startBinary(t, "routes:\n  - name: pay\n    match: \"POST /payments\"\n")
	if status, body := get(t, sc.Admin+"/app/readyz"); status != http.StatusNotFound || !strings.Contains(body, "upstream.health_path") {
		t.Errorf("/app/readyz without a health path: %d %s, want 404 naming upstream.health_path", status, body)
	}
	if strings.Contains(scrape(t, sc.Admin), "idemproxy_upstream_up") {
		t.Error("idemproxy_upstream_up is exposed without a health path")
	}
}
