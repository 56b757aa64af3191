package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	e := newEnv(t, slow(150*time.Millisecond, created), nil)
	results := burst(t, e, 100, req{user: "alice", key: "k-1", body: `{"amount":100}`})
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times for one key, want 1", n)
	}
	var original *resp
	for i := range results {
		if results[i].status == http.StatusCreated && results[i].header.Get("Idempotent-Replayed") == "" {
			if original != nil {
				t.Fatal("two responses claim to be the original execution")
			}
			original = &results[i]
		}
	}
	if original == nil {
		t.Fatal("no response is the original execution")
	}
	conflicts, replays := 0, 0
	for _, r := range results {
		switch {
		case r.status == http.StatusConflict:
			conflicts++
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("409 with Retry-After %q, want whole seconds >= 1", r.header.Get("Retry-After"))
			}
			if r.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(r.body, "request-in-progress") {
				t.Errorf("409 is not the request-in-progress problem: %s", r.body)
			}
		case r.header.Get("Idempotent-Replayed") == "true":
			replays++
			if r.status != original.status || r.body != original.body || r.header.Get("X-Charge-Id") != original.header.Get("X-Charge-Id") {
				t.Errorf("replay differs from the original:\n got %d %s\nwant %d %s", r.status, r.body, original.status, original.body)
			}
		case r.status != http.StatusCreated: // the original is the only other 201
			t.Errorf("unexpected response %d %s", r.status, r.body)
		}
	}
	if conflicts+replays != 99 {
		t.Errorf("%d conflicts + %d replays, want 99 besides the original", conflicts, replays)
	}
	got := e.outcomes()
	if got["stored"] != 1 || got["conflict"]+got["replayed"] != 99 {
		t.Errorf("outcomes = %v, want 1 stored and 99 conflict or replayed", got)
	}
}

func TestConcurrentDuplicatesWaitForOneAnswer(t *testing.T) {
	e := newEnv(t, slow(150*time.Millisecond, created), func(c *setup) {
		c.Routes[0].Wait = true
		c.Routes[0].MaxWait = 10 * time.Second
	})
	results := burst(t, e, 100, req{user: "alice", key: "k-1", body: `{"amount":100}`})
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times for one key, want 1", n)
	}
	for _, r := range results {
		if r.status != http.StatusCreated || r.body != results[0].body {
			t.Fatalf("with concurrent: wait every retry must get the one answer; got %d %s, want 201 %s", r.status, r.body, results[0].body)
		}
	}
}

// TestWaitersAreWokenNotPolled: retries waiting for the first attempt
// (concurrent: wait) learn of its answer from the message its completion
// publishes. With the safety poll and the lease far beyond the test, a
// waiter that was not woken would wait out max_wait (a minute) and time
// the test out; and each waiter looks at the key about twice (when its
// channel goes live, and when woken), where polling every 10-200 ms for the
// upstream's second looked 9 times.
func TestWaitersAreWokenNotPolled(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // a failing test must not leave the upstream blocked
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		created(w, r)
	}, func(c *setup) {
		c.Routes[0].Wait = true
		c.Routes[0].MaxWait = time.Minute
		c.Routes[0].Lease = time.Minute
		c.WaitSafetyPoll = time.Hour
	})
	const waiters = 50
	first := make(chan resp, 1)
	go func() { first <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	gets := func() int64 { return commandCalls(t, e, "get") }
	before := gets()
	results := make(chan resp, waiters)
	for range waiters {
		go func() { results <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	}
	poll.Until(t, "every waiter is waiting", func() bool {
		return e.h.Waiting() == waiters
	})
	time.Sleep(time.Second) // what polling waiters would spend asking
	open()
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first attempt: %d", r.status)
	}
	timeout := time.After(30 * time.Second)
	for range waiters {
		select {
		case r := <-results:
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("waiter: %d replayed=%q, want the replayed 201", r.status, r.header.Get("Idempotent-Replayed"))
			}
		case <-timeout:
			t.Fatal("waiters were not woken by the completion")
		}
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
	if before < 0 {
		t.Log("the embedded store counts no commands: the count is not checked")
		return
	}
	got := gets() - before
	t.Logf("%d waiters over about 1s looked at the key %d times", waiters, got)
	// Each waiter's claim reads the key once inside the claim script (a
	// GET in commandstats too); beyond that, at most 3 looks each.
	if got > 4*waiters {
		t.Errorf("%d waiters looked at the key %d times, want at most 4 each (the claim's own GET, then 3)", waiters, got)
	}
}

// commandCalls is how many times Redis ran cmd (INFO commandstats), -1 on
// the embedded store, which does not count them.
func commandCalls(t *testing.T, e *env, cmd string) int64 {
	t.Helper()
	if e.redis == nil {
		return -1
	}
	info, err := e.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// burst sends n copies of r at once.
func burst(t *testing.T, e *env, n int, r req) []resp {
	t.Helper()
	results := make([]resp, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			got, err := e.try(context.Background(), r)
			if err != nil {
				t.Error(err)
			}
			results[i] = got
		})
	}
	close(start)
	wg.Wait()
	return results
}

func TestReplayIsByteIdentical(t *testing.T) {
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		w.Header().Set("Location", "/payments/1")
		created(w, r)
	}, nil)
	first := e.do(req{user: "alice", key: "k", body: `{"a":1}`})
	second := e.do(req{user: "alice", key: "k", body: `{"a":1}`})
	if first.status != http.StatusCreated || second.status != first.status || second.body != first.body {
		t.Fatalf("replay %d %q, original %d %q", second.status, second.body, first.status, first.body)
	}
	for _, h := range []string{"Content-Type", "X-Charge-Id", "Location", "Content-Length"} {
		if second.header.Get(h) != first.header.Get(h) {
			t.Errorf("%s: replay %q, original %q", h, second.header.Get(h), first.header.Get(h))
		}
	}
	if strings.Join(second.header.Values("X-Multi"), ",") != "a,b" {
		t.Errorf("multi-valued header replayed as %q", second.header.Values("X-Multi"))
	}
	if first.header.Get("Idempotent-Replayed") != "" || second.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("Idempotent-Replayed: original %q, replay %q", first.header.Get("Idempotent-Replayed"), second.header.Get("Idempotent-Replayed"))
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

func TestPrincipalsAreIsolated(t *testing.T) {
	e := newEnv(t, created, nil)
	alice := e.do(req{user: "alice", key: "shared", body: `{}`})
	bob := e.do(req{user: "bob", key: "shared", body: `{}`})
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times for two principals, want 2", n)
	}
	if !strings.Contains(alice.body, `"alice"`) || !strings.Contains(bob.body, `"bob"`) {
		t.Fatalf("cross-principal replay: alice got %s, bob got %s", alice.body, bob.body)
	}
	bobAgain := e.do(req{user: "bob", key: "shared", body: `{}`})
	if bobAgain.body != bob.body || bobAgain.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("bob's retry got %s, want a replay of %s", bobAgain.body, bob.body)
	}
}

func TestSpoofedIdentityFromUntrustedPeer(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		untrusted(c)
		c.Routes = append(c.Routes, route("opt", "POST /optional"))
		c.Routes[1].RequireKey = false
	})
	// With a key: the forged principal is dropped, so there is none: 401.
	r := e.do(req{user: "mallory-as-alice", key: "k", body: `{}`})
	if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "identity-missing") {
		t.Fatalf("spoofed identity with a key: %d %s, want 401 identity-missing", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 0 {
		t.Fatalf("upstream executed %d times, want 0", n)
	}
	// Unprotected traffic is forwarded, but never with the forged header.
	for _, path := range []string{"/other", "/optional"} {
		r = e.do(req{path: path, user: "mallory-as-alice", body: `{}`})
		if r.status != http.StatusCreated {
			t.Fatalf("%s: %d, want the upstream's 201", path, r.status)
		}
		if got := e.ledger.Last().Get("X-Forwarded-User"); got != "" {
			t.Fatalf("%s: the upstream saw X-Forwarded-User %q from an untrusted peer", path, got)
		}
	}
}

func TestTrustedIdentityAndKeyAreForwarded(t *testing.T) {
	e := newEnv(t, created, nil)
	r := e.do(req{user: "alice", key: `"sf-string-key"`, body: `{}`, header: map[string]string{"X-Request-Id": "rid-1"}})
	if r.status != http.StatusCreated {
		t.Fatalf("%d %s", r.status, r.body)
	}
	seen := e.ledger.Last()
	if seen.Get("X-Forwarded-User") != "alice" || seen.Get("Idempotency-Key") != "sf-string-key" || seen.Get("X-Request-Id") != "rid-1" {
		t.Fatalf("upstream saw user %q key %q request id %q", seen.Get("X-Forwarded-User"), seen.Get("Idempotency-Key"), seen.Get("X-Request-Id"))
	}
	// The bare token form of the same key is the same key.
	again := e.do(req{user: "alice", key: "sf-string-key", body: `{}`})
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("bare form of the key was not a replay: %d %s", again.status, again.body)
	}
}

func TestChangedBodyIsMismatch(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].IgnoreJSONFields = []string{"/attempt", "/meta/sent_at"}
		c.Routes = append(c.Routes, route("capture", "POST /orders/{id}/capture"))
	})
	e.do(req{user: "alice", key: "k", body: `{"amount":100,"attempt":1,"meta":{"sent_at":"t1","x":1}}`})
	r := e.do(req{user: "alice", key: "k", body: `{"amount":200,"attempt":1,"meta":{"sent_at":"t1","x":1}}`})
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, "key-reused") {
		t.Fatalf("changed amount: %d %s, want 422 key-reused", r.status, r.body)
	}
	// Only ignored fields changed, keys reordered, whitespace added: a replay.
	r = e.do(req{user: "alice", key: "k", body: `{ "meta":{"x":1,"sent_at":"t2"}, "attempt":2, "amount":100 }`})
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("only ignored fields changed: %d %s, want a replay", r.status, r.body)
	}
	// One key on two concrete paths of one route is a different request.
	e.do(req{path: "/orders/1/capture", user: "alice", key: "c", body: `{}`})
	r = e.do(req{path: "/orders/2/capture", user: "alice", key: "c", body: `{}`})
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same key on another order: %d %s, want 422", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2", n)
	}
}

func TestTransientIsReleasedSettledIsStored(t *testing.T) {
	var mu sync.Mutex
	statuses := map[string][]int{"busy": {503, 201}, "limited": {429, 201}, "boom": {500, 201}, "gw": {504, 201}}
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		k := r.Header.Get("Idempotency-Key")
		code := statuses[k][0]
		statuses[k] = statuses[k][1:]
		mu.Unlock()
		w.WriteHeader(code)
		fmt.Fprintf(w, "answer %d", code)
	}, nil)
	for _, tc := range []struct {
		key         string
		first, then int
		executions  int
	}{
		{"busy", 503, 201, 2},    // released: the retry really retries
		{"limited", 429, 201, 2}, // released
		{"boom", 500, 500, 1},    // stored: the upstream may have acted
		{"gw", 504, 504, 1},      // stored, unless an operator adds it to release_on
	} {
		first := e.do(req{user: "alice", key: tc.key, body: `{}`})
		then := e.do(req{user: "alice", key: tc.key, body: `{}`})
		if first.status != tc.first || then.status != tc.then {
			t.Errorf("%s: got %d then %d, want %d then %d", tc.key, first.status, then.status, tc.first, tc.then)
		}
		e.ledger.mu.Lock()
		n := e.ledger.calls[tc.key]
		e.ledger.mu.Unlock()
		if n != tc.executions {
			t.Errorf("%s: upstream executed %d times, want %d", tc.key, n, tc.executions)
		}
	}
}

func TestDialRefusedReleases(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.Upstream = &url.URL{Scheme: "http", Host: ln.Addr().String()}
		ln.Close() // nothing listens here now: connections are refused
	})
	r := e.do(req{user: "alice", key: "k", body: `{}`})
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "upstream-unreachable") {
		t.Fatalf("dial refused: %d %s, want 502 upstream-unreachable", r.status, r.body)
	}
	r = e.do(req{user: "alice", key: "k", body: `{}`})
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "upstream-unreachable") {
		t.Fatalf("retry after dial refused: %d %s, want another real attempt (502 again), not a 409", r.status, r.body)
	}
	if got := e.outcomes()["released"]; got != 2 {
		t.Fatalf("released = %v, want 2", got)
	}
}

func TestClientDisconnectStillStores(t *testing.T) {
	e := newEnv(t, slow(300*time.Millisecond, created), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := e.try(ctx, req{user: "alice", key: "k", body: `{}`}); err == nil {
		t.Fatal("the client should have given up before the upstream answered")
	}
	var r resp
	poll.Until(t, "the retry is answered from the store", func() bool {
		r = e.do(req{user: "alice", key: "k", body: `{}`})
		return r.status != http.StatusConflict
	})
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after disconnect: %d %s, want a replayed 201", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

func TestStaleOwnerCannotComplete(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		created(w, r)
	}, nil)
	key := e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k")
	done := make(chan resp)
	go func() { done <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt holds the claim", func() bool { return e.ledger.Total() == 1 })
	// Another owner takes the key over, as after a lapsed lease.
	ctx := context.Background()
	rdb := e.rdb
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	usurper := &claim.Record{State: claim.InProgress, Created: time.Now()}
	usurper.Token[0] = 42
	if res, err := e.store.Claim(ctx, key, usurper, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("takeover claim: %+v %v", res, err)
	}
	close(release)
	r := <-done
	if r.status != http.StatusCreated {
		t.Fatalf("the stale owner's client gets the upstream's answer; got %d", r.status)
	}
	rec, _, err := e.store.Get(ctx, key)
	if err != nil || rec == nil || rec.Token != usurper.Token || rec.State != claim.InProgress {
		t.Fatalf("record after the stale completion: %+v %v; want the new owner's, untouched", rec, err)
	}
	if got := e.outcomes()["fence_lost"]; got != 1 {
		t.Fatalf("fence_lost = %v, want 1", got)
	}
}

func TestUnknownOutcomeKeepsOrReleases(t *testing.T) {
	for _, policy := range []proxy.Unknown{proxy.Keep, proxy.Release} {
		t.Run(policy.String(), func(t *testing.T) {
			hang := make(chan struct{})
			defer close(hang)
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Idempotency-Key") == "hang" {
					select {
					case <-hang:
					case <-r.Context().Done():
					}
					return
				}
				created(w, r)
			}, func(c *setup) {
				c.UpstreamTimeout = 300 * time.Millisecond
				c.LateAnswerWindow = 0 // cancel at the timeout, as before late answers
				c.Routes[0].Unknown = policy
			})
			r := e.do(req{user: "alice", key: "hang", body: `{}`})
			if r.status != http.StatusGatewayTimeout || !strings.Contains(r.body, "upstream-timeout") {
				t.Fatalf("hung upstream: %d %s, want 504 upstream-timeout", r.status, r.body)
			}
			r = e.do(req{user: "alice", key: "hang", body: `{}`})
			if policy == proxy.Keep && r.status != http.StatusConflict {
				t.Fatalf("keep: retry got %d, want 409 while the claim is held", r.status)
			}
			if policy == proxy.Release && r.status != http.StatusGatewayTimeout {
				t.Fatalf("release: retry got %d, want a second real attempt", r.status)
			}
		})
	}
}

func TestOversizedResponseIsNotReplayedNorReExecuted(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, big)
	}, func(c *setup) { c.Routes[0].MaxResponseBody = 1 << 10 })
	first := e.do(req{user: "alice", key: "k", body: `{}`})
	if first.status != http.StatusCreated || first.body != big {
		t.Fatalf("first attempt: %d, %d bytes; want the whole 201 streamed", first.status, len(first.body))
	}
	retry := e.do(req{user: "alice", key: "k", body: `{}`})
	var p struct {
		Type           string `json:"type"`
		OriginalStatus int    `json:"original_status"`
	}
	if err := json.Unmarshal([]byte(retry.body), &p); err != nil {
		t.Fatalf("retry body %q: %v", retry.body, err)
	}
	if retry.status != http.StatusConflict || p.Type != "urn:idemproxy:problem:response-not-replayable" || p.OriginalStatus != 201 {
		t.Fatalf("retry: %d %s, want 409 response-not-replayable with original_status 201", retry.status, retry.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

func TestSidecarDeathAfterClaim(t *testing.T) {
	// A sidecar that claims and dies leaves an in-progress record that no
	// one renews: retries get 409 until the lease lapses, then execute.
	e := newEnv(t, created, func(c *setup) { c.Routes[0].Lease = time.Second })
	// The same request body and path as the probe's, another key.
	dead := &claim.Record{State: claim.InProgress, Created: time.Now(), Fingerprint: e.probeFingerprint()}
	key := e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k")
	if res, err := e.store.Claim(context.Background(), key, dead, time.Second, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("dead sidecar's claim: %+v %v", res, err)
	}
	r := e.do(req{user: "alice", key: "k", body: `{}`})
	if r.status != http.StatusConflict {
		t.Fatalf("retry during the dead owner's lease: %d, want 409", r.status)
	}
	poll.Until(t, "the dead owner's lease lapses and the retry executes", func() bool {
		return e.do(req{user: "alice", key: "k", body: `{}`}).status == http.StatusCreated
	})
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times (probe + one), want 2", n)
	}
}

func TestStoreUnavailable(t *testing.T) {
	for _, policy := range []string{"fail_closed", "fail_open"} {
		t.Run(policy, func(t *testing.T) {
			e := newEnvOn(t, redistest.Start(t), created, func(c *setup) { c.Routes[0].FailOpen = policy == "fail_open" })
			e.redis.Stop()
			r := e.do(req{user: "alice", key: "k", body: `{"amount":1}`})
			switch policy {
			case "fail_closed":
				if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "store-unavailable") {
					t.Fatalf("fail_closed: %d %q %s, want 503 store-unavailable with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
				}
				if n := e.ledger.Total(); n != 0 {
					t.Fatalf("fail_closed forwarded %d requests", n)
				}
				// Nothing was forwarded: not the dual-write window.
				e.quiesce()
				if o := e.outcomes(); o["store_unavailable"] != 1 || o["store_error"] != 0 {
					t.Fatalf("outcomes %v, want store_unavailable 1 and store_error 0", o)
				}
			case "fail_open":
				if r.status != http.StatusCreated || e.ledger.Total() != 1 {
					t.Fatalf("fail_open: %d with %d executions, want the upstream's 201", r.status, e.ledger.Total())
				}
				if !strings.Contains(e.ledger.Last().Get("Content-Type"), "json") {
					t.Fatal("fail_open lost request headers")
				}
			}
		})
	}
}

func TestBadRequestsAreRejectedBeforeAnyClaim(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].MaxRequestBody = 1 << 10
		c.Routes = append(c.Routes, route("opt", "POST /optional"))
		c.Routes[1].RequireKey = false
	})
	long := strings.Repeat("k", 256)
	for _, tc := range []struct {
		name   string
		r      req
		status int
		typ    string
	}{
		{"missing key", req{user: "alice", body: `{}`}, 400, "key-missing"},
		{"empty key", req{user: "alice", key: `""`, body: `{}`}, 400, "key-malformed"},
		{"key too long", req{user: "alice", key: long, body: `{}`}, 400, "key-malformed"},
		{"key with space", req{user: "alice", key: `"a b"`, body: `{}`}, 400, "key-malformed"},
		{"key with params", req{user: "alice", key: `"a";x=1`, body: `{}`}, 400, "key-malformed"},
		{"unterminated quote", req{user: "alice", key: `"abc`, body: `{}`}, 400, "key-malformed"},
		{"non-ascii key", req{user: "alice", key: "kéy", body: `{}`}, 400, "key-malformed"},
		{"key without principal", req{key: "k", body: `{}`}, 401, "identity-missing"},
		{"body over the cap", req{user: "alice", key: "k", body: strings.Repeat("a", 2<<10)}, 413, "body-too-large"},
		{"malformed key, optional route", req{path: "/optional", user: "alice", key: `"x`, body: `{}`}, 400, "key-malformed"},
	} {
		r := e.do(tc.r)
		if r.status != tc.status || !strings.Contains(r.body, "urn:idemproxy:problem:"+tc.typ) || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want %d %s problem", tc.name, r.status, r.body, tc.status, tc.typ)
		}
	}
	if keys, _ := e.rdb.Keys(context.Background(), "*").Result(); len(keys) != 0 {
		t.Errorf("rejected requests left %d keys in Redis", len(keys))
	}
	if n := e.ledger.Total(); n != 0 {
		t.Errorf("rejected requests reached the upstream %d times", n)
	}
	// A chunked body past the cap, with no Content-Length to refuse early.
	hr, _ := http.NewRequest(http.MethodPost, e.front.URL+"/payments", io.MultiReader(strings.NewReader(strings.Repeat("a", 2<<10))))
	hr.Header.Set("X-Forwarded-User", "alice")
	hr.Header.Set("Idempotency-Key", "chunked")
	hresp, err := e.front.Client().Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	hresp.Body.Close()
	if hresp.StatusCode != http.StatusRequestEntityTooLarge || hr.ContentLength != 0 {
		t.Errorf("chunked body over the cap: %d, want 413", hresp.StatusCode)
	}
	// An optional route without a key is forwarded unprotected.
	r := e.do(req{path: "/optional", body: `{}`})
	if r.status != http.StatusCreated || e.ledger.Total() != 1 {
		t.Errorf("optional route without key: %d, want forwarded", r.status)
	}
	if got := e.outcomes(); got["rejected"] != 11 || got["bypassed"] != 1 {
		t.Errorf("outcomes = %v, want 11 rejected and 1 bypassed", got)
	}
}

func TestPathVariantsAreProtected(t *testing.T) {
	e := newEnv(t, created, nil)
	// Every variant is this route: never forwarded unprotected. Those whose
	// decoded path is not the canonical one are refused outright (the
	// upstream must get the path that was matched and fingerprinted).
	for path, problem := range map[string]string{
		"/payments": "key-missing", "/pay%6Dents": "key-missing", "/payments?x=1": "key-missing",
		"//payments": "path-not-canonical", "/payments/": "path-not-canonical", "/x/../payments": "path-not-canonical",
	} {
		r := e.do(req{path: path, user: "alice", body: `{}`})
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, problem) {
			t.Errorf("%s without a key: %d %s, want 400 %s (protected)", path, r.status, r.body, problem)
		}
	}
	r := e.do(req{method: "post", user: "alice", body: `{}`})
	if r.status != http.StatusBadRequest {
		t.Errorf("lower-case method: %d, want it protected", r.status)
	}
	// Other methods on the same path are not this route: passed through,
	// never a mux 405.
	r = e.do(req{method: http.MethodGet, user: "alice"})
	if r.status != http.StatusCreated {
		t.Errorf("GET /payments: %d, want the upstream's answer", r.status)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Errorf("upstream executed %d times, want only the GET", n)
	}
}

// Go's http.Transport resends a request carrying Idempotency-Key when a
// reused keep-alive connection dies before the response, even after the
// upstream acted. The proxy must never let it.
func TestTransportNeverResendsAfterUpstreamActed(t *testing.T) {
	for _, body := range []string{"", `{"amount":1}`} {
		t.Run(fmt.Sprintf("body=%d bytes", len(body)), func(t *testing.T) {
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Idempotency-Key") != "trap" {
					created(w, r)
					return
				}
				// Act, then drop the connection without answering.
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				conn.Close()
			}, nil)
			// Warm a keep-alive connection so the next request reuses it.
			if r := e.do(req{method: http.MethodGet, path: "/warm"}); r.status != http.StatusCreated {
				t.Fatal(r.status)
			}
			r := e.do(req{user: "alice", key: "trap", body: body})
			if n := e.ledger.Total(); n != 2 {
				t.Fatalf("upstream executed the protected request %d times, want 1", n-1)
			}
			if r.status != http.StatusBadGateway || !strings.Contains(r.body, "upstream-failed") {
				t.Fatalf("connection dropped after the upstream acted: %d %s, want 502 upstream-failed", r.status, r.body)
			}
			if r := e.do(req{user: "alice", key: "trap", body: body}); r.status != http.StatusConflict {
				t.Fatalf("retry after an unknown outcome: %d, want 409 (unknown_outcome: keep)", r.status)
			}
		})
	}
}

func TestWaiterClaimsAfterRelease(t *testing.T) {
	var calls sync.Map
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := calls.LoadOrStore("n", new(int))
		p := n.(*int)
		*p++ // the upstream handler runs one request at a time here
		if *p == 1 {
			time.Sleep(200 * time.Millisecond)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		created(w, r)
	}, func(c *setup) {
		c.Routes[0].Wait = true
		c.Routes[0].MaxWait = 5 * time.Second
	})
	first := make(chan resp)
	go func() { first <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	waiter := e.do(req{user: "alice", key: "k", body: `{}`})
	if r := <-first; r.status != http.StatusServiceUnavailable {
		t.Fatalf("first attempt: %d, want the upstream's 503", r.status)
	}
	if waiter.status != http.StatusCreated || waiter.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("waiter: %d replayed=%q, want it to claim the released key and execute", waiter.status, waiter.header.Get("Idempotent-Replayed"))
	}
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2", n)
	}
}

func TestWaiterGivesUpAfterMaxWait(t *testing.T) {
	e := newEnv(t, slow(time.Second, created), func(c *setup) {
		c.Routes[0].Wait = true
		c.Routes[0].MaxWait = 200 * time.Millisecond
	})
	first := make(chan resp)
	go func() { first <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	waiter := e.do(req{user: "alice", key: "k", body: `{}`})
	if waiter.status != http.StatusConflict || waiter.header.Get("Retry-After") == "" {
		t.Fatalf("waiter past max_wait: %d, want 409 with Retry-After", waiter.status)
	}
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first attempt: %d", r.status)
	}
}

// max_response_body caps the whole stored response, headers included: an
// answer with a small body and huge headers is passed on whole, stored
// without them, and a retry gets 409 response-not-replayable, never a
// second execution.
func TestOversizedHeadersAreNotStored(t *testing.T) {
	big := strings.Repeat("h", 2<<10)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		for i := range 4 {
			w.Header().Set(fmt.Sprint("X-Big-", i), big)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	}, func(c *setup) { c.Routes[0].MaxResponseBody = 4 << 10 })
	first := e.do(req{user: "alice", key: "k", body: `{}`})
	if first.status != http.StatusCreated || first.header.Get("X-Big-3") != big || first.body != `{"ok":true}` {
		t.Fatalf("first attempt: %d, %d-byte header, %q; want the whole answer", first.status, len(first.header.Get("X-Big-3")), first.body)
	}
	rec, _, err := e.store.Get(context.Background(), e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k"))
	if err != nil || rec == nil || !rec.BodyOmitted || len(rec.Header) != 0 || len(rec.Body) != 0 {
		t.Fatalf("stored record: %+v, %v; want the status only", rec, err)
	}
	retry := e.do(req{user: "alice", key: "k", body: `{}`})
	if retry.status != http.StatusConflict || !strings.Contains(retry.body, "response-not-replayable") {
		t.Fatalf("retry: %d %s, want 409 response-not-replayable", retry.status, retry.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}
