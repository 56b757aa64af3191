package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/clockshim"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestRedisClockStepNeverFreesAForwardedClaim, through the real binary on
// a real redis-server whose clock a shim moves while it runs: the sidecar
// has measured its clock against Redis' (the store watcher, every second),
// then Redis' clock steps forward by more than the rule's margin (an NTP
// step, a resumed VM, a failover to a host whose clock is off) and a first
// attempt claims at once, before the watcher measures again. Its claim's
// SET then runs, on Redis' clock, later than its Created time allows, so
// a retry would take it for never forwarded; but the owner forwarded it.
// The retry, sent while the upstream still works on the first attempt,
// must get 409 and the upstream must run once. v0.5.0 freed the claim and
// executed twice for every step of 1.7 s or more.
func TestRedisClockStepNeverFreesAForwardedClaim(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	clock := buildClock(t)
	for _, step := range []time.Duration{2 * time.Second, 3 * time.Second} {
		t.Run(step.String(), func(t *testing.T) {
			if err := clock.Set(0); err != nil {
				t.Fatal(err)
			}
			srv := redistest.StartEnv(t, clock.Env())
			upstream := binarytest.NewRecorder(t)
			upstream.Delay = 1500 * time.Millisecond
			sc := startBinary(t, payConfig(upstream.URL, srv.Addr, ""))
			if status, body := post(t, sc.Client+"/payments", "warm-up", `{}`); status != http.StatusCreated {
				t.Fatalf("warm-up: %d %s", status, body)
			}
			time.Sleep(1500 * time.Millisecond) // the store watcher measures the clocks (within 500 ms of each other)

			if err := clock.Set(step); err != nil {
				t.Fatal(err)
			}
			defer clock.Set(0)
			var wg sync.WaitGroup
			var first int
			wg.Go(func() { first, _ = post(t, sc.Client+"/payments", "stepped", `{"amount":1}`) })
			// The retry comes while the upstream works, long before the
			// owner's first renewal (lease/3).
			time.Sleep(300 * time.Millisecond)
			resp, body := postAnswer(t, sc.Client+"/payments", "stepped", `{"amount":1}`)
			wg.Wait()
			if n := upstream.Executions("stepped"); n != 1 {
				t.Fatalf("the upstream ran %d times for one key after Redis' clock stepped %v (retry: %d %s); logs:\n%s", n, step, resp.StatusCode, body, sc.Logs())
			}
			if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "request-in-progress") {
				t.Errorf("retry during the first attempt: %d %s, want 409 request-in-progress", resp.StatusCode, body)
			}
			if first != http.StatusCreated {
				t.Errorf("first attempt: %d, want 201", first)
			}
			if status, body := post(t, sc.Client+"/payments", "stepped", `{"amount":1}`); status != http.StatusCreated || upstream.Executions("stepped") != 1 {
				t.Errorf("retry after the first attempt: %d %s (executions %d), want the replayed 201", status, body, upstream.Executions("stepped"))
			}
		})
	}
}

// TestFlushThenImmediateRetryIsRecordLost, through the real binary on a
// real redis-server: a request that says when it was first sent
// (Repeatability-First-Sent) executes; Redis is flushed (FLUSHALL: the
// connections stay up, so no new connection makes the sidecar look at the
// epoch marker); its retry, sent at once, before the store watcher's next
// look, must get 412 record-lost with nothing forwarded: the claim reads
// the marker in its own round trip. A request first sent now still
// executes. v0.5.0 executed the retry a second time until the watcher's
// next look (about a second later).
func TestFlushThenImmediateRetryIsRecordLost(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	srv := redistest.Start(t)
	upstream := binarytest.NewRecorder(t)
	sc := startBinary(t, payConfig(upstream.URL, srv.Addr, ""))
	send := func(key string, firstSent time.Time) (int, string) {
		t.Helper()
		return postFirstSent(t, sc.Client+"/payments", key, firstSent)
	}
	sent := time.Now().Add(-5 * time.Second)
	if status, body := send("before-flush", sent); status != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", status, body)
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch marker since
	for range 3 {
		if err := srv.Client().FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		status, body := send("before-flush", sent)
		if n := upstream.Executions("before-flush"); n != 1 {
			t.Fatalf("the retry right after FLUSHALL executed again (%d executions): %d %s; logs:\n%s", n, status, body, sc.Logs())
		}
		if status != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
			t.Fatalf("the retry right after FLUSHALL: %d %s, want 412 record-lost", status, body)
		}
		time.Sleep(1200 * time.Millisecond) // the next flush comes after the watcher's next look
	}
	if status, body := send("after-flush", time.Now()); status != http.StatusCreated || upstream.Executions("after-flush") != 1 {
		t.Errorf("a request first sent now: %d %s, want 201 (executed once)", status, body)
	}
}

// TestFlushWhileRedisClockIsBehindIsRecordLost, through the real binary
// on a real redis-server whose clock a shim keeps 3 s behind: a request
// first sent 4 s before the flush (beyond first_sent_skew and the HTTP
// date's second) executes; Redis is flushed; its retry must get 412 record-lost. The
// epoch marker that the flush makes the sidecar create is when the new
// epoch began: read on Redis' clock alone it is 3 s early, and every
// request first sent in those 3 s before the loss executed again (the
// chaos run's user-2/op-78 after FLUSHALL with the clock stepped back).
func TestFlushWhileRedisClockIsBehindIsRecordLost(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	clock := buildClock(t)
	if err := clock.Set(-3 * time.Second); err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartEnv(t, clock.Env())
	upstream := binarytest.NewRecorder(t)
	sc := startBinary(t, payConfig(upstream.URL, srv.Addr, ""))
	// First sent 4 s before the flush, which comes 1.5 s from now.
	sent := time.Now().Add(1500*time.Millisecond - 4*time.Second)
	if status, body := postFirstSent(t, sc.Client+"/payments", "behind", sent); status != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", status, body)
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch marker since
	if err := srv.Client().FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	status, body := postFirstSent(t, sc.Client+"/payments", "behind", sent)
	if n := upstream.Executions("behind"); n != 1 {
		t.Fatalf("the retry after FLUSHALL, Redis' clock 3 s behind, executed again (%d executions): %d %s; logs:\n%s", n, status, body, sc.Logs())
	}
	if status != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
		t.Fatalf("the retry after FLUSHALL: %d %s, want 412 record-lost", status, body)
	}
	if status, body := postFirstSent(t, sc.Client+"/payments", "after", time.Now()); status != http.StatusCreated || upstream.Executions("after") != 1 {
		t.Errorf("a request first sent now: %d %s, want 201 (executed once)", status, body)
	}
}

// buildClock builds the clock shim for a redis-server, skipping the test
// without a C compiler (failing under IDEMPROXY_REQUIRE_REDIS=1).
func buildClock(t *testing.T) *clockshim.Clock {
	t.Helper()
	clock, err := clockshim.Build(t.TempDir())
	if err != nil {
		if os.Getenv(redistest.RequireEnv) == "1" {
			t.Fatal(err) // CI has a C compiler
		}
		t.Skip(err)
	}
	return clock
}

// TestRedisClockStepNeverFreesALiveOwnerOnReconcile (issue 53), through
// the real binary on a real redis-server whose clock a shim steps: on a
// reconcile route (lease 2s, absent_after 5s), the first attempt's call
// runs 3 s in the app, which commits at its end. Redis' clock steps 10 s
// forward while it runs, so the live claim's PTTL falls under its tail and
// it looks orphaned until its owner's next renewal; a retry at once, on
// the same sidecar and on a second one, must never take the claim over
// and free it on the lookup's truthful 404: the upstream runs once and
// every retry ends with the first attempt's 201. 0fc8fae executed the
// retry a second time (5 of 5). Without reconcile (unknown_outcome: fail)
// the retry settled the live claim as 502 outcome-unknown: one execution,
// but the answer changed, and the first client's 201 was never stored.
func TestRedisClockStepNeverFreesALiveOwnerOnReconcile(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	clock := buildClock(t)
	l, upstream := newLedger(t)
	for _, via := range []string{"same sidecar", "second sidecar", "same sidecar without reconcile"} {
		t.Run(via, func(t *testing.T) {
			if err := clock.Set(0); err != nil {
				t.Fatal(err)
			}
			srv := redistest.StartEnv(t, clock.Env())
			cfg := fmt.Sprintf(`upstream:
  url: %q
  timeout: 4s
  late_answer_window: 0s
store:
  redis:
    addrs: [%q]
defaults:
  lease: 2s
routes:
  - name: pay
    match: "POST /payments"
    reconcile:
      url: "/payments/by-key/{key}"
      status: 201
      timeout: 500ms
      absent_after: 5s
`, upstream.URL, srv.Addr)
			if strings.HasSuffix(via, "without reconcile") {
				// unknown_outcome: fail settles an orphan as outcome-unknown:
				// a live owner's answer would be replaced by a 502.
				cfg = cfg[:strings.Index(cfg, "    reconcile:")]
			}
			a := startBinary(t, cfg)
			retryOn := a
			if via == "second sidecar" {
				retryOn = startBinary(t, cfg)
			}
			key := "stepped-" + strings.ReplaceAll(via, " ", "-")
			l.mu.Lock()
			l.first[key] = "late"
			l.lateAct = 3 * time.Second
			l.mu.Unlock()
			time.Sleep(1200 * time.Millisecond) // the store watchers measure the clocks

			var wg sync.WaitGroup
			var first int
			var firstBody string
			wg.Go(func() { first, firstBody = post(t, a.Client+"/payments", key, `{"amount":1}`) })
			poll.Until(t, "the first attempt reaches the app", func() bool { return l.executions(key) == 1 })
			time.Sleep(100 * time.Millisecond)
			if err := clock.Set(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			defer clock.Set(0)
			var status int
			var body string
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				status, body = post(t, retryOn.Client+"/payments", key, `{"amount":1}`)
				if status != http.StatusConflict {
					break
				}
				time.Sleep(150 * time.Millisecond)
			}
			wg.Wait()
			if n := l.executions(key); n != 1 {
				t.Fatalf("the upstream ran %d times for one key after Redis' clock stepped 10s forward (retry via the %s: %d %s); logs:\n%s", n, via, status, body, retryOn.Logs())
			}
			want := fmt.Sprintf(`{"id":"ch_%s_1"}`, key)
			if first != http.StatusCreated || firstBody != want {
				t.Errorf("first attempt: %d %s, want 201 %s", first, firstBody, want)
			}
			if status != http.StatusCreated || body != want {
				t.Errorf("retry via the %s: %d %s, want the first attempt's 201 %s", via, status, body, want)
			}
		})
	}
}
