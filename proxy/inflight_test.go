package proxy_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/proxy"
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
	if got := e.counter("idemproxy_overloaded_total", map[string]string{"route": "pay", "reason": "process_cap"}); got != 1 {
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

// TestMaxInFlightPrincipalShare (issue 30, item 5): one principal holds at
// most its share of max_in_flight, so its slow calls cannot turn every
// other principal's first attempt into 503 overloaded; and a call whose
// client was answered 504 (a late call, bounded from then on by the
// late-call pool) gives its slot back. Before, with max_in_flight 2,
// mallory's two slow calls made alice's first attempt 503 for up to
// upstream.timeout + late_answer_window (5.5 minutes by default).
func TestMaxInFlightPrincipalShare(t *testing.T) {
	up := newHeld()
	e := newEnv(t, up.app(created), func(c *setup) {
		c.UpstreamTimeout = 700 * time.Millisecond
		c.Routes[0].MaxInFlight = 2
		c.Routes[0].MaxInFlightShare = 1
	})
	var once sync.Once
	release := func() { once.Do(func() { close(up.release) }) }
	defer release()
	var wg sync.WaitGroup
	defer wg.Wait()
	first := make(chan resp, 1)
	wg.Go(func() { first <- e.do(req{user: "mallory", key: "slow-1", body: `{}`}) })
	poll.Until(t, "mallory's first call upstream", func() bool { return e.ledger.Total() == 1 })
	r := e.do(req{user: "mallory", key: "slow-2", body: `{}`})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "overloaded") || !strings.Contains(r.body, "share") {
		t.Fatalf("mallory's second slow call: %d %s, want 503 overloaded naming her share", r.status, r.body)
	}
	if got := e.counter("idemproxy_overloaded_total", map[string]string{"route": "pay", "reason": "principal_share"}); got != 1 {
		t.Errorf("refusals for the share: %v, want 1", got)
	}
	// alice still gets the other slot while mallory's call runs.
	alice := make(chan resp, 1)
	wg.Go(func() { alice <- e.do(req{user: "alice", key: "a", body: `{}`}) })
	poll.Until(t, "alice's call upstream", func() bool { return e.ledger.Total() == 2 })
	// mallory's client is answered 504 at upstream.timeout: her call goes
	// on as a late call, and her max_in_flight slot is free again.
	if r := <-first; r.status != http.StatusGatewayTimeout {
		t.Fatalf("mallory's first call: %d %s, want 504 (a late call)", r.status, r.body)
	}
	<-alice
	second := make(chan resp, 1)
	wg.Go(func() { second <- e.do(req{user: "mallory", key: "slow-2", body: `{}`}) })
	poll.Until(t, "mallory's second call upstream while her first runs late", func() bool { return e.ledger.Total() == 3 })
	release()
	if r := <-second; r.status != http.StatusCreated && r.status != http.StatusGatewayTimeout {
		t.Fatalf("mallory's second call once her first was a late call: %d %s, want it forwarded", r.status, r.body)
	}
}

// TestShedClaimFreedWhenItsReleaseFails: a key shed by max_in_flight
// whose release fails (the store went away for a moment) is deleted by
// the background cleanup once the store answers: the retry after the
// claim's lease executes, once, where the claim left behind would have
// been answered outcome-unknown (unknown_outcome: fail).
func TestShedClaimFreedWhenItsReleaseFails(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	app := func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == "busy" {
			<-release
		}
		created(w, r)
	}
	flaky := &flakyStore{}
	e := newEnv(t, app, func(c *setup) {
		c.Routes[0].MaxInFlight = 1
		c.Routes[0].Lease = time.Second
		c.Routes[0].Unknown = proxy.Fail
		c.WrapStore = func(s proxy.Store) proxy.Store { flaky.Store = s; return flaky }
	})
	var wg sync.WaitGroup
	wg.Go(func() { e.do(req{user: "alice", key: "busy", body: `{}`}) })
	poll.Until(t, "the first attempt upstream", func() bool { return e.ledger.Total() == 1 })
	flaky.release.Store(1)
	if r := e.do(req{user: "alice", key: "shed", body: `{}`}); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "overloaded") {
		t.Fatalf("a second key with one forwarding: %d %s, want 503 overloaded", r.status, r.body)
	}
	free()
	wg.Wait()
	time.Sleep(1200 * time.Millisecond) // past the shed claim's lease
	if r := e.do(req{user: "alice", key: "shed", body: `{}`}); r.status != http.StatusCreated || e.ledger.Total() != 2 {
		t.Fatalf("the shed key retried after its lease: %d %s (executions %d), want 201 and one execution", r.status, r.body, e.ledger.Total())
	}
}
