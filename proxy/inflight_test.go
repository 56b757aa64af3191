package proxy_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/internal/poll"
)

// max_in_flight (issue 21): beyond the bound a new key is answered 503
// overloaded with Retry-After, its claim released (a retry really
// executes, once); replays and in-progress answers are never refused.
func TestMaxInFlight(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	// Registered after newEnv's cleanups, so it runs before them: a failed
	// check must not leave the upstream's handlers blocked.
	defer free()
	app := func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("Idempotency-Key"); k == "a" || k == "b" {
			<-release
		}
		created(w, r)
	}
	e := newEnv(t, app, func(c *setup) { c.Routes[0].MaxInFlight = 2 })
	if r := e.do(req{user: "alice", key: "done", body: `{}`}); r.status != http.StatusCreated {
		t.Fatal("a first key before the load: ", r.status)
	}
	var wg sync.WaitGroup
	for _, k := range []string{"a", "b"} {
		wg.Go(func() { e.do(req{user: "alice", key: k, body: `{}`}) })
	}
	poll.Until(t, "two first attempts upstream", func() bool { return e.ledger.Total() == 3 })
	r := e.do(req{user: "alice", key: "c", body: `{}`})
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, "overloaded") {
		t.Fatalf("a third key with two forwarding: %d %q %s, want 503 overloaded with Retry-After: 1", r.status, r.header.Get("Retry-After"), r.body)
	}
	if r := e.do(req{user: "alice", key: "done", body: `{}`}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a replay while the route is full: %d, want the replay", r.status)
	}
	if r := e.do(req{user: "alice", key: "a", body: `{}`}); r.status != http.StatusConflict {
		t.Errorf("a retry in progress while the route is full: %d, want 409", r.status)
	}
	if got := e.counter("idemproxy_overloaded_total", map[string]string{"route": "pay"}); got != 1 {
		t.Errorf("idemproxy_overloaded_total = %v, want 1", got)
	}
	free()
	wg.Wait()
	if r := e.do(req{user: "alice", key: "c", body: `{}`}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("the refused key retried: %d replayed=%q, want it executed now", r.status, r.header.Get("Idempotent-Replayed"))
	}
	if n := e.ledger.Total(); n != 4 {
		t.Fatalf("upstream executed %d times, want 4 (done, a, b, c once each)", n)
	}
}
