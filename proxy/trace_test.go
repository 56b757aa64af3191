package proxy_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestTracesLinkRetriesToTheExecution: each protected request is a server
// span continuing the client's trace, with client spans for its store
// operations and its upstream call, whose traceparent the upstream gets.
// A replay, a 409 and a 422 are spans of their own traces, linked to the
// span of the attempt that executed. No span carries the raw key or the
// principal.
func TestTracesLinkRetriesToTheExecution(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)              // a failing test must not leave the upstream blocked
	var upstreamParents sync.Map // traceparent the upstream got, by request id
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		upstreamParents.Store(r.Header.Get("X-Request-Id"), r.Header.Get("Traceparent"))
		<-release
		created(w, r)
	}, func(c *setup) { c.TracerProvider = tp })

	clientTrace := func(n byte) (trace.SpanContext, map[string]string) {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1, 2, 3, n}, SpanID: trace.SpanID{9, 9, n}, TraceFlags: trace.FlagsSampled,
		})
		h := http.Header{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(t.Context(), sc), propagation.HeaderCarrier(h))
		return sc, map[string]string{"Traceparent": h.Get("Traceparent"), "X-Request-Id": "req-" + string('0'+n)}
	}
	const rawKey, principal = "raw-key-7f3a", "alice-principal"
	body := `{"amount":100}`

	// The first attempt, held upstream while a concurrent retry gets 409.
	parent1, h1 := clientTrace(1)
	first := make(chan resp, 1)
	go func() { first <- e.do(req{user: principal, key: rawKey, body: body, header: h1}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	_, h2 := clientTrace(2)
	if r := e.do(req{user: principal, key: rawKey, body: body, header: h2}); r.status != http.StatusConflict {
		t.Fatalf("concurrent retry: %d, want 409", r.status)
	}
	open()
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first attempt: %d", r.status)
	}
	_, h3 := clientTrace(3)
	if r := e.do(req{user: principal, key: rawKey, body: body, header: h3}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d, want a replay", r.status)
	}
	_, h4 := clientTrace(4)
	if r := e.do(req{user: principal, key: rawKey, body: `{"amount":999}`, header: h4}); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("reuse with another body: %d, want 422", r.status)
	}
	e.quiesce()

	ended := spans.Ended()
	server := map[string]sdktrace.ReadOnlySpan{} // by the client's trace
	for _, s := range ended {
		for _, kv := range s.Attributes() {
			if v := kv.Value.String(); strings.Contains(v, rawKey) || strings.Contains(v, principal) {
				t.Errorf("span %q carries %s = %q: the raw key or principal", s.Name(), kv.Key, v)
			}
		}
		if s.SpanKind() == trace.SpanKindServer {
			server[s.SpanContext().TraceID().String()] = s
		}
	}
	exec := server[parent1.TraceID().String()]
	if exec == nil {
		t.Fatalf("no server span in the first attempt's trace; spans: %v", names(ended))
	}
	if exec.Parent().SpanID() != parent1.SpanID() {
		t.Errorf("the first attempt's span has parent %s, want the client's %s", exec.Parent().SpanID(), parent1.SpanID())
	}
	if got := attr(exec, "idemproxy.outcome"); got != "stored" {
		t.Errorf("first attempt outcome attribute = %q, want stored", got)
	}
	if attr(exec, "idemproxy.key") == "" {
		t.Error("the first attempt's span has no hashed key")
	}
	children := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range ended {
		if s.Parent().SpanID() == exec.SpanContext().SpanID() {
			children[s.Name()] = s
		}
	}
	for _, want := range []string{"EVALSHA", "POST"} {
		if children[want] == nil || children[want].SpanKind() != trace.SpanKindClient {
			t.Errorf("no client span %q under the first attempt; its children: %v", want, keys(children))
		}
	}
	if up := children["POST"]; up != nil {
		got, _ := upstreamParents.Load("req-1")
		want := "00-" + parent1.TraceID().String() + "-" + up.SpanContext().SpanID().String() + "-01"
		if got != want {
			t.Errorf("the upstream got traceparent %q, want %q (its call's span)", got, want)
		}
	}
	for n, outcome := range map[byte]string{2: "conflict", 3: "replayed", 4: "mismatch"} {
		sc, _ := clientTrace(n)
		s := server[sc.TraceID().String()]
		if s == nil {
			t.Errorf("no server span for the %s retry", outcome)
			continue
		}
		if got := attr(s, "idemproxy.outcome"); got != outcome {
			t.Errorf("retry %d outcome attribute = %q, want %s", n, got, outcome)
		}
		if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != exec.SpanContext().SpanID() ||
			s.Links()[0].SpanContext.TraceID() != exec.SpanContext().TraceID() {
			t.Errorf("the %s retry's links = %v, want one link to the execution's span %s", outcome, s.Links(), exec.SpanContext().SpanID())
		}
	}
	if got := attr(server[mustTrace(clientTrace(3))], "idemproxy.replayed"); got != "true" {
		t.Errorf("replay's idemproxy.replayed = %q, want true", got)
	}
}

func mustTrace(sc trace.SpanContext, _ map[string]string) string { return sc.TraceID().String() }

func attr(s sdktrace.ReadOnlySpan, key string) string {
	if s == nil {
		return ""
	}
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.String()
		}
	}
	return ""
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// An untrusted peer's traceparent is at most a link (issue 24): with a
// sampler that samples only what a sampled parent asks for, a trusted
// proxy's sampled traceparent parents a recorded span; an untrusted
// client's starts no span of its trace, forces no sampling (nothing is
// recorded).
func TestUntrustedTraceContextIsNotAParent(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	app := created
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{7, 7}, SpanID: trace.SpanID{7}, TraceFlags: trace.FlagsSampled})
	h := http.Header{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(t.Context(), sc), propagation.HeaderCarrier(h))
	headers := func(id string) map[string]string {
		return map[string]string{"Traceparent": h.Get("Traceparent"), "Tracestate": "vendor=attacker", "Baggage": "user=mallory", "X-Request-Id": id}
	}

	trusted := newEnv(t, app, func(c *setup) { c.TracerProvider = tp })
	if r := trusted.do(req{user: "alice", key: "a", body: `{}`, header: headers("trusted")}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	var parented bool
	for _, s := range spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer && s.Parent().TraceID() == sc.TraceID() {
			parented = true
		}
	}
	if !parented {
		t.Fatal("a trusted proxy's sampled traceparent did not parent the server span")
	}

	before := len(spans.Ended())
	u := newEnv(t, app, func(c *setup) { c.TracerProvider = tp; untrusted(c) })
	if r := u.do(req{key: "b", body: `{}`, header: headers("untrusted")}); r.status != http.StatusUnauthorized {
		t.Fatalf("untrusted, no principal: %d, want 401", r.status)
	}
	if n := len(spans.Ended()) - before; n != 0 {
		t.Errorf("an untrusted client's sampled traceparent got %d spans recorded (a rejected request's spans reached the exporter)", n)
	}
}

// TestPassThroughIsCountedAndTraced (issue 32): a request no route
// protects (most of an app's traffic) is counted by the class of its
// answer and is a server span named by its method, with the status, and
// error.type from 500 on. Before, pass-through requests had neither: with
// the app down, nothing but a WARN line said so.
func TestPassThroughIsCountedAndTraced(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/broken" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}, func(c *setup) { c.TracerProvider = tp })
	e.do(req{method: http.MethodGet, path: "/catalog"})
	e.do(req{method: http.MethodGet, path: "/catalog"})
	e.do(req{method: http.MethodGet, path: "/broken"})
	e.quiesce()
	for class, want := range map[string]float64{"2xx": 2, "5xx": 1, "4xx": 0} {
		if got := e.counter("idemproxy_passthrough_requests_total", map[string]string{"class": class}); got != want {
			t.Errorf("idemproxy_passthrough_requests_total{class=%q} = %v, want %v", class, got, want)
		}
	}
	var ok, failed int
	for _, s := range spans.Ended() {
		if s.Name() != "GET" || s.SpanKind() != trace.SpanKindServer {
			continue
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		// Issue 57: url.path (required on HTTP server spans), and the
		// conventions' schema URL on the tracer's scope.
		if p := attrs["url.path"].AsString(); p != "/catalog" && p != "/broken" {
			t.Errorf("a pass-through span's url.path = %q", p)
		}
		if s.InstrumentationScope().SchemaURL == "" {
			t.Error("the tracer's scope has no schema URL")
		}
		switch attrs["http.response.status_code"].AsInt64() {
		case 200:
			ok++
		case 503:
			if attrs["error.type"].AsString() != "503" {
				t.Errorf("a 503 pass-through span has error.type %q, want 503", attrs["error.type"].AsString())
			}
			failed++
		}
	}
	if ok != 2 || failed != 1 {
		t.Errorf("pass-through spans: %d with 200, %d with 503; want 2 and 1", ok, failed)
	}
}

// TestSpanConventions (issue 32): the gaps the OpenTelemetry conventions
// left, closed: a server span answering 5xx carries error.type (the
// status), store spans carry db.namespace (Redis database 0), and every
// span names idemproxy's version as its instrumentation scope's.
func TestSpanConventions(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}, func(c *setup) { c.TracerProvider = tp })
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusInternalServerError {
		t.Fatalf("first attempt: %d", r.status)
	}
	e.quiesce()
	var server, store bool
	for _, s := range spans.Ended() {
		if v := s.InstrumentationScope().Version; v != "v9.9.9-test" {
			t.Errorf("span %q: instrumentation version %q, want the build's", s.Name(), v)
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		switch {
		case s.SpanKind() == trace.SpanKindServer:
			server = true
			if attrs["error.type"].AsString() != "500" {
				t.Errorf("a 500 server span: error.type %q, want 500", attrs["error.type"].AsString())
			}
		case attrs["db.system.name"].AsString() == "redis":
			store = true
			if attrs["db.namespace"].AsString() != "0" {
				t.Errorf("store span %q: db.namespace %q, want 0", s.Name(), attrs["db.namespace"].AsString())
			}
		}
	}
	if !server || !store {
		t.Fatalf("spans seen: server %t, store %t", server, store)
	}
}

// Logs and spans find each other (issue 46): with tracing on, the request
// line carries the request's trace id; the server span carries the
// request id the app got; a client span whose upstream call failed (a
// reset after the request was sent) carries error.type, as do the 5xx.
func TestLogsAndSpansCarryEachOthersIDs(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close() // acted, and the answer is lost
		}
	}, func(c *setup) { c.TracerProvider = tp })
	r := e.do(req{user: "alice", key: "k-reset", body: `{}`, header: map[string]string{"X-Request-Id": "req-traced-1"}})
	if r.status != http.StatusBadGateway {
		t.Fatalf("reset: %d", r.status)
	}
	e.quiesce()
	var serverTrace string
	var client bool
	for _, s := range spans.Ended() {
		attrs := map[attribute.Key]attribute.Value{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value
		}
		switch s.SpanKind() {
		case trace.SpanKindServer:
			serverTrace = s.SpanContext().TraceID().String()
			if got := attrs["idemproxy.request_id"].AsString(); got != "req-traced-1" {
				t.Errorf("server span idemproxy.request_id = %q, want req-traced-1", got)
			}
		case trace.SpanKindClient:
			if _, upstream := attrs["url.full"]; !upstream {
				continue // a store call's span
			}
			client = true
			if got := attrs["error.type"].AsString(); got == "" {
				t.Errorf("failed upstream call's client span has no error.type (attributes %v)", attrs)
			}
		}
	}
	if serverTrace == "" || !client {
		t.Fatalf("spans: server trace %q, client span %t", serverTrace, client)
	}
	var line string
	for l := range strings.Lines(e.logs.String()) {
		if strings.Contains(l, `"msg":"request"`) && strings.Contains(l, "req-traced-1") {
			line = l
		}
	}
	if !strings.Contains(line, `"trace_id":"`+serverTrace+`"`) {
		t.Errorf("the request's log line lacks trace_id %s: %s", serverTrace, line)
	}
}
