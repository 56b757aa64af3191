package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// Tracing is on with tracing.enabled or an OTLP endpoint in the
// environment, and OTEL_SDK_DISABLED=true turns it off whatever else says.
func TestTracingOn(t *testing.T) {
	for _, tc := range []struct {
		enabled bool
		env     map[string]string
		want    bool
	}{
		{false, nil, false},
		{true, nil, true},
		{false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{false, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{true, map[string]string{"OTEL_SDK_DISABLED": "true"}, false},
		{false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{false, map[string]string{"OTEL_SERVICE_NAME": "payments"}, false},
	} {
		if got := tracingOn(config.Tracing{Enabled: tc.enabled}, func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("enabled=%v env=%v: tracing on = %v, want %v", tc.enabled, tc.env, got, tc.want)
		}
	}
}

// With an OTLP endpoint in the environment the sidecar exports its spans
// there (OTLP/HTTP protobuf), flushed at the latest when it stops.
func TestTracesAreExported(t *testing.T) {
	var mu sync.Mutex
	var posts []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		posts = append(posts, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type")+" "+strconv.Itoa(len(body)))
		mu.Unlock()
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Traceparent"), "00-") {
			t.Errorf("the upstream got no traceparent: %q", r.Header.Get("Traceparent"))
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	cfg := lateConfig(redistest.Start(t), upstream.URL)
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	if status, _ := pay(t, s.clientAddr, "k1"); status != http.StatusCreated {
		t.Fatalf("first attempt: %d", status)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(posts) == 0 || !strings.HasPrefix(posts[0], "POST /v1/traces application/x-protobuf") {
		t.Fatalf("the collector got %q, want a POST of spans to /v1/traces", posts)
	}
}
