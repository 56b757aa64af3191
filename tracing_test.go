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

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
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

// TestTracesFollowSemanticConventions decodes what an OTLP collector
// receives: the resource (SDK defaults, service.name and service.version),
// the server span named "{method} {http.route}" with the HTTP attributes,
// the upstream client span with url.full and server.*, and Redis spans
// named after the command sent, one of which failed (Redis stopped) and
// carries error.type and an error status.
func TestTracesFollowSemanticConventions(t *testing.T) {
	var mu sync.Mutex
	var got []*tracepb.ResourceSpans
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("collector: %v", err)
			return
		}
		mu.Lock()
		got = append(got, req.ResourceSpans...)
		mu.Unlock()
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	srv := redistest.Start(t)
	cfg := lateConfig(srv, upstream.URL)
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	if status, _ := pay(t, s.clientAddr, "k1"); status != http.StatusCreated {
		t.Fatalf("first attempt: %d", status)
	}
	srv.Stop()
	if status, _ := pay(t, s.clientAddr, "k2"); status != http.StatusServiceUnavailable {
		t.Fatalf("with Redis stopped: %d, want 503", status)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	attrs := func(kvs []*commonpb.KeyValue) map[string]string {
		m := map[string]string{}
		for _, kv := range kvs {
			v := kv.GetValue()
			switch {
			case v.GetStringValue() != "":
				m[kv.GetKey()] = v.GetStringValue()
			default:
				m[kv.GetKey()] = strconv.FormatInt(v.GetIntValue(), 10)
			}
		}
		return m
	}
	spans := map[string][]*tracepb.Span{}
	for _, rs := range got {
		res := attrs(rs.GetResource().GetAttributes())
		for _, k := range []string{"service.name", "service.version", "telemetry.sdk.name", "telemetry.sdk.language", "telemetry.sdk.version"} {
			if res[k] == "" {
				t.Errorf("resource lacks %s: %v", k, res)
			}
		}
		if res["service.name"] != "idemproxy" {
			t.Errorf("service.name = %q", res["service.name"])
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				spans[sp.GetName()] = append(spans[sp.GetName()], sp)
			}
		}
	}
	want := func(name string, keys ...string) map[string]string {
		t.Helper()
		if len(spans[name]) == 0 {
			var names []string
			for n := range spans {
				names = append(names, n)
			}
			t.Fatalf("no span named %q; got %q", name, names)
		}
		a := attrs(spans[name][0].GetAttributes())
		for _, k := range keys {
			if a[k] == "" {
				t.Errorf("span %q lacks %s: %v", name, k, a)
			}
		}
		return a
	}
	server := want("POST /payments", "http.request.method", "http.route", "url.scheme", "server.address", "server.port", "client.address", "user_agent.original", "http.response.status_code")
	if server["http.route"] != "/payments" || strings.Contains(server["server.address"], ":") {
		t.Errorf("server span: http.route %q, server.address %q (want /payments and a host without port)", server["http.route"], server["server.address"])
	}
	up := want("POST", "url.full", "server.address", "server.port")
	if !strings.HasPrefix(up["url.full"], upstream.URL) {
		t.Errorf("upstream span url.full %q, want under %s", up["url.full"], upstream.URL)
	}
	want("EVALSHA", "db.system.name", "db.operation.name", "server.address", "server.port")
	failed := 0
	for _, sp := range spans["EVALSHA"] {
		if sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR && attrs(sp.GetAttributes())["error.type"] != "" {
			failed++
		}
	}
	if failed == 0 {
		t.Error("no EVALSHA span with an error status and error.type for the claim Redis refused")
	}
}
