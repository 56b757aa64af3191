package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/proxy"
)

// held is an upstream that acts at once and answers only when the test
// lets it, as a slow database would; answered is set once it has.
type held struct {
	release  chan struct{}
	answered atomic.Bool
	// cancelled counts calls whose context ended before the release.
	cancelled atomic.Int64
}

func newHeld() *held { return &held{release: make(chan struct{})} }

func (u *held) app(answer http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-u.release:
		case <-r.Context().Done():
			u.cancelled.Add(1)
			return
		}
		answer(w, r)
		u.answered.Store(true)
	}
}

// counter returns the value of the series of a counter vector with the
// given labels.
func (e *env) counter(name string, labels map[string]string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// The client stops waiting at upstream.timeout, the upstream call does
// not: its late answer is stored, retries get 409 until it comes, then the
// replay; the upstream executes once.
func TestLateAnswerIsStoredAndReplayed(t *testing.T) {
	up := newHeld()
	e := newEnv(t, up.app(created), func(c *setup) { c.UpstreamTimeout = time.Second })
	first := e.do(req{user: "alice", key: "k", body: `{}`})
	if first.status != http.StatusGatewayTimeout || !strings.Contains(first.body, "upstream-timeout") || !strings.Contains(first.body, "still running upstream") {
		t.Fatalf("first attempt: %d %s, want 504 upstream-timeout saying the request still runs", first.status, first.body)
	}
	if first.header.Get("Retry-After") == "" || up.answered.Load() {
		t.Fatalf("504 without Retry-After (%q), or after the upstream answered", first.header.Get("Retry-After"))
	}
	during := e.do(req{user: "alice", key: "k", body: `{}`})
	if during.status != http.StatusConflict || !strings.Contains(during.body, "request-in-progress") {
		t.Fatalf("retry while the late call runs: %d %s, want 409 request-in-progress", during.status, during.body)
	}
	close(up.release)
	var after resp
	poll.Until(t, "the late answer is replayed", func() bool {
		after = e.do(req{user: "alice", key: "k", body: `{}`})
		return after.status != http.StatusConflict
	})
	if after.status != http.StatusCreated || after.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(after.body, `"charged_to":"alice"`) {
		t.Fatalf("retry after the late answer: %d %v %s, want the 201 replayed", after.status, after.header, after.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
	e.quiesce()
	if got := e.counter("idemproxy_late_answers_total", map[string]string{"route": "pay", "result": "stored"}); got != 1 {
		t.Errorf("late_answers_total{result=stored} = %v, want 1", got)
	}
	// The request is counted and logged once, when its client is answered
	// 504 (issue 32: before, only when the late answer settled, minutes
	// later, and as stored); the settlement is a second event, its own
	// line and idemproxy_late_answers_total.
	if got := e.outcomes(); got["upstream_timeout"] != 1 || got["stored"] != 0 || got["conflict"] < 1 {
		t.Errorf("outcomes = %v, want the late request counted once, as upstream_timeout", got)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"outcome":"upstream_timeout","status":504`) || !strings.Contains(logs, `"msg":"late answer"`) || !strings.Contains(logs, `"result":"stored"`) {
		t.Errorf("want a request line (upstream_timeout, 504) and a late answer line (stored):\n%s", logs)
	}
}

// TestTimedOutClientIsRecordedWhenAnswered (issue 32): the 504 is logged,
// counted and traced when the client gets it, while the upstream call is
// still running; before, nothing was recorded until the late-answer
// window ended (330 s later by default), and then as stored.
func TestTimedOutClientIsRecordedWhenAnswered(t *testing.T) {
	up := newHeld()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	e := newEnv(t, up.app(created), func(c *setup) {
		c.UpstreamTimeout = 500 * time.Millisecond
		c.TracerProvider = tp
	})
	var once sync.Once
	release := func() { once.Do(func() { close(up.release) }) }
	defer release()
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d, want 504", r.status)
	}
	poll.Until(t, "the 504 is counted while the call runs", func() bool {
		return e.counter("idemproxy_requests_total", map[string]string{"route": "pay", "outcome": "upstream_timeout"}) == 1
	})
	// answeredTimeout counts, logs, then ends the span: poll for the
	// span too (it once lost that race by microseconds under -race),
	// while the upstream is still held.
	var server trace.SpanContext
	poll.Until(t, "the request's span ends when its client is answered", func() bool {
		for _, s := range spans.Ended() {
			if s.SpanKind() == trace.SpanKindServer {
				server = s.SpanContext()
			}
		}
		return server.IsValid()
	})
	if up.answered.Load() {
		t.Fatal("the upstream answered already: the test did not hold it, so the span ended with the late answer, not with the 504")
	}
	release()
	poll.Until(t, "the late answer is recorded", func() bool {
		return e.counter("idemproxy_late_answers_total", map[string]string{"route": "pay", "result": "stored"}) == 1
	})
	e.quiesce()
	if got := e.outcomes(); got["upstream_timeout"] != 1 || got["stored"] != 0 {
		t.Errorf("outcomes = %v, want the request counted once, as upstream_timeout", got)
	}
	linked := false
	for _, s := range spans.Ended() {
		if s.Name() != "late answer" {
			continue
		}
		for _, l := range s.Links() {
			linked = linked || l.SpanContext.SpanID() == server.SpanID()
		}
	}
	if !linked {
		t.Error("no late answer span linked to the request's span")
	}
}

// A late answer in release_on frees the key, as a timely one does: the
// retry executes.
func TestLateTransientAnswerReleases(t *testing.T) {
	up := newHeld()
	var calls atomic.Int64
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			up.app(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) })(w, r)
			return
		}
		created(w, r)
	}, func(c *setup) { c.UpstreamTimeout = time.Second })
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d, want 504", r.status)
	}
	close(up.release)
	poll.Until(t, "the late 503 releases the key and the retry executes", func() bool {
		return e.do(req{user: "alice", key: "k", body: `{}`}).status == http.StatusCreated
	})
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2 (the 503 did nothing)", n)
	}
	e.quiesce()
	if got := e.counter("idemproxy_late_answers_total", map[string]string{"result": "released"}); got != 1 {
		t.Errorf("late_answers_total{result=released} = %v, want 1", got)
	}
}

// Beyond upstream.max_late_calls a call is cancelled at the timeout and its
// unknown_outcome applies; here fail, so every retry gets outcome-unknown.
func TestLateCallCap(t *testing.T) {
	up := newHeld()
	e := newEnv(t, up.app(created), func(c *setup) {
		c.UpstreamTimeout = time.Second
		c.MaxLateCalls = 1
		c.Routes[0].Unknown = proxy.Fail
	})
	if r := e.do(req{user: "alice", key: "a", body: `{}`}); r.status != http.StatusGatewayTimeout {
		t.Fatalf("first call: %d, want 504 and a late call", r.status)
	}
	capped := e.do(req{user: "alice", key: "b", body: `{}`})
	if capped.status != http.StatusBadGateway || !strings.Contains(capped.body, "outcome-unknown") || capped.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("call beyond the cap: %d %v %s, want 502 outcome-unknown", capped.status, capped.header, capped.body)
	}
	poll.Until(t, "the capped call is cancelled upstream", func() bool { return up.cancelled.Load() == 1 })
	retry := e.do(req{user: "alice", key: "b", body: `{}`})
	if retry.status != http.StatusBadGateway || retry.body != capped.body || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of the capped call: %d %s, want the same 502 replayed", retry.status, retry.body)
	}
	close(up.release)
	poll.Until(t, "the late call's answer is replayed", func() bool {
		return e.do(req{user: "alice", key: "a", body: `{}`}).status == http.StatusCreated
	})
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2 (once per key)", n)
	}
	e.quiesce()
	if got := e.counter("idemproxy_unknown_outcomes_total", map[string]string{"handling": "fail"}); got != 1 {
		t.Errorf("unknown_outcomes_total{handling=fail} = %v, want 1", got)
	}
}

// unknown_outcome: fail turns a connection broken after the request was
// sent into a stored 502 outcome-unknown: every retry gets it, nothing
// executes again.
func TestOutcomeUnknownIsStoredInFailMode(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // acted, then the connection broke
		}
	}, func(c *setup) { c.Routes[0].Unknown = proxy.Fail })
	first := e.do(req{user: "alice", key: "k", body: `{}`})
	if first.status != http.StatusBadGateway || !strings.Contains(first.body, "urn:idemproxy:problem:outcome-unknown") || !strings.Contains(first.body, "new key") {
		t.Fatalf("first attempt: %d %s, want 502 outcome-unknown", first.status, first.body)
	}
	for range 3 {
		r := e.do(req{user: "alice", key: "k", body: `{}`})
		if r.status != http.StatusBadGateway || r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" ||
			r.header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("retry: %d %v %q, want the first 502 replayed byte for byte", r.status, r.header, r.body)
		}
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

// In fail mode a claim whose owner vanished (a killed sidecar: nobody
// renews, nobody settles) is an unknown outcome too: during its lease
// retries get 409, after it the next attempt settles the key as
// outcome-unknown instead of executing.
func TestOrphanedClaimIsSettledInFailMode(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].Lease = time.Second
		c.Routes[0].Unknown = proxy.Fail
	})
	ctx := context.Background()
	if r := e.do(req{user: "alice", key: "probe", body: `{}`}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	probe, _, err := e.store.Get(ctx, e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "probe"))
	if err != nil || probe == nil {
		t.Fatal(err)
	}
	dead := &claim.Record{State: claim.InProgress, Created: time.Now(), RequestID: "dead-owner", Fingerprint: probe.Fingerprint, Tail: time.Hour}
	key := e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k")
	if res, err := e.store.Claim(ctx, key, dead, time.Second, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("dead sidecar's claim: %+v %v", res, err)
	}
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusConflict {
		t.Fatalf("retry during the dead owner's lease: %d, want 409", r.status)
	}
	var settled resp
	poll.Until(t, "the dead owner's lease lapses", func() bool {
		settled = e.do(req{user: "alice", key: "k", body: `{}`})
		return settled.status != http.StatusConflict
	})
	if settled.status != http.StatusBadGateway || !strings.Contains(settled.body, "outcome-unknown") ||
		!strings.Contains(settled.body, `"request_id":"dead-owner"`) || settled.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the lease: %d %v %s, want 502 outcome-unknown for the dead owner's request", settled.status, settled.header, settled.body)
	}
	again := e.do(req{user: "alice", key: "k", body: `{}`})
	if again.status != http.StatusBadGateway || again.body != settled.body {
		t.Fatalf("next retry: %d %s, want the same 502", again.status, again.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times (the probe only), want 1", n)
	}
	e.quiesce()
	if got := e.counter("idemproxy_unknown_outcomes_total", map[string]string{"handling": "orphan"}); got != 1 {
		t.Errorf("unknown_outcomes_total{handling=orphan} = %v, want 1", got)
	}
}

// A waiter (concurrent: wait) outlasting the client's 504 gets the late
// answer replayed.
func TestWaiterGetsLateAnswer(t *testing.T) {
	up := newHeld()
	e := newEnv(t, up.app(created), func(c *setup) {
		c.UpstreamTimeout = 500 * time.Millisecond
		c.Routes[0].Wait = true
		c.Routes[0].MaxWait = 5 * time.Second
	})
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusGatewayTimeout {
		t.Fatalf("first attempt: %d, want 504", r.status)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		close(up.release)
	}()
	r := e.do(req{user: "alice", key: "k", body: `{}`})
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("waiting retry: %d %s, want the late 201 replayed", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

// One principal's late calls cannot cost another a double execution
// (issue 24, finding 3): with upstream.max_late_calls 3 and a per-principal
// share of 1, mallory parks slow calls and hangs up; only the first gets a
// slot, the others are the ones cancelled; alice's slow call still gets its
// slot, its late answer is stored and her retry replays it: one execution.
func TestLateCallsPrincipalShare(t *testing.T) {
	up := newHeld()
	var executed atomic.Int64
	e := newEnv(t, up.app(func(w http.ResponseWriter, r *http.Request) {
		executed.Add(1)
		created(w, r)
	}), func(c *setup) {
		c.UpstreamTimeout = 500 * time.Millisecond
		c.MaxLateCalls = 3
		c.LateCallsPrincipalShare = 1
		c.Routes[0].Unknown = proxy.Keep // a cancelled call's retry executes again
	})
	var once sync.Once
	release := func() { once.Do(func() { close(up.release) }) }
	defer release() // a failure must not leave the late calls to their 5m window
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		e.try(ctx, req{user: "mallory", key: "park-" + string(rune('a'+i)), body: `{}`})
		cancel()
	}
	if got := e.counter("idemproxy_late_calls_refused_total", map[string]string{"reason": "principal_share"}); got != 2 {
		t.Errorf("mallory's calls refused for her share: %v, want 2", got)
	}
	victim := e.do(req{user: "alice", key: "victim", body: `{}`})
	if victim.status != http.StatusGatewayTimeout || !strings.Contains(victim.body, "still running upstream") {
		t.Fatalf("alice's slow call: %d %s, want 504 with the call still running", victim.status, victim.body)
	}
	release()
	var r resp
	poll.Until(t, "alice's late answer is stored", func() bool {
		r = e.do(req{user: "alice", key: "victim", body: `{}`})
		return r.status != http.StatusConflict
	})
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry: %d %s, want the replay", r.status, r.body)
	}
}
