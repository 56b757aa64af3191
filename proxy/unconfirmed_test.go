package proxy_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestClaimsThatNeverForwarded: a claim left in Redis by a sidecar that
// died is answered by what can be known of it. One whose SET ran well
// after it was sent (its reply came too late for its owner to forward:
// Redis stalled) is freed by the next attempt, which executes at once,
// under fail and keep. One confirmed in time whose owner died before
// forwarding cannot be told from one that died after: under fail (the
// default) the retries get 409 for the lease, then 502 outcome-unknown;
// under keep they execute after the lease. Both as docs/guarantee.md documents.
func TestClaimsThatNeverForwarded(t *testing.T) {
	t.Parallel() // on its own store and servers; mostly waiting: runs beside the others (go test ./... time)
	for _, tc := range []struct {
		name    string
		unknown proxy.Unknown
		late    bool   // the dead claim's SET ran 3s after it was sent
		want    int    // what the retries settle on
		problem string // in the body of that answer
	}{
		{"fail, claim ran late", proxy.Fail, true, http.StatusCreated, ""},
		{"keep, claim ran late", proxy.Keep, true, http.StatusCreated, ""},
		{"fail, claim confirmed, owner died", proxy.Fail, false, http.StatusBadGateway, "outcome-unknown"},
		{"keep, claim confirmed, owner died", proxy.Keep, false, http.StatusCreated, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, created, func(c *setup) {
				c.Routes[0].Lease = time.Second
				c.Routes[0].Unknown = tc.unknown
			})
			e.store.CheckClocks(context.Background()) // what the store watcher does every second
			dead := &claim.Record{State: claim.InProgress, Created: time.Now(), Fingerprint: e.probeFingerprint(), RequestID: "dead"}
			if tc.late {
				dead.Created = time.Now().Add(-3 * time.Second)
			}
			if tc.unknown == proxy.Fail {
				dead.Tail = time.Hour
			}
			key := e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k")
			if err := e.store.PlantUnconfirmed(context.Background(), key, dead, time.Second); err != nil {
				t.Fatalf("dead sidecar's claim: %v", err)
			}
			var r resp
			poll.Until(t, "the retries settle", func() bool {
				r = e.do(req{user: "alice", key: "k", body: `{}`})
				return r.status != http.StatusConflict
			})
			if r.status != tc.want || !strings.Contains(r.body, tc.problem) {
				t.Fatalf("retry: %d %s, want %d %s", r.status, r.body, tc.want, tc.problem)
			}
			want := 1 // the probe
			if tc.want == http.StatusCreated {
				want = 2
			}
			if n := e.ledger.Total(); n != want {
				t.Fatalf("upstream executed %d times, want %d", n, want)
			}
			if tc.late && e.counter("idemproxy_unconfirmed_claims_total", map[string]string{"result": "cleared_on_retry"}) != 1 {
				t.Error("the late claim was not counted as cleared_on_retry")
			}
		})
	}
}

// gauge returns the value of a gauge (or gauge func) without labels.
func (e *env) gauge(name string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	e.t.Fatalf("no gauge %s", name)
	return 0
}

// unconfirmedTotal is every unconfirmed claim counted, whatever its result.
func (e *env) unconfirmedTotal() float64 {
	n := 0.0
	for _, r := range []string{"released", "not_found", "gave_up", "cleared_on_retry"} {
		n += e.counter("idemproxy_unconfirmed_claims_total", map[string]string{"result": r})
	}
	return n
}

// TestClaimsThatNeverReachedRedis (issue 30): a claim that could not get a
// connection at all (Redis refuses them) wrote nothing, so nothing is
// queued to clean up. Before the fix each one was: a 2-minute outage at
// 275 requests/s queued 12,000, logged 2,000 ERROR lines and sent 20,000
// commands when Redis came back.
func TestClaimsThatNeverReachedRedis(t *testing.T) {
	t.Parallel() // on its own store and servers; mostly waiting: runs beside the others (go test ./... time)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens here now: connections are refused
	e := newEnvStore(t, nil, redisstore.ClientOptions{Addrs: []string{dead}}, created, nil)
	for i := range 20 {
		r := e.do(req{user: "alice", key: fmt.Sprint("k", i), body: `{}`})
		if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "store-unavailable") {
			t.Fatalf("Redis refusing connections: %d %s, want 503 store-unavailable", r.status, r.body)
		}
	}
	e.quiesce()
	if n := e.gauge("idemproxy_unconfirmed_claims_pending"); n != 0 {
		t.Errorf("%v claims queued for cleanup, want 0: none was written", n)
	}
	if n := e.unconfirmedTotal(); n != 0 {
		t.Errorf("%v unconfirmed claims counted, want 0", n)
	}
	if e.ledger.Total() != 0 {
		t.Errorf("upstream executed %d times with Redis down", e.ledger.Total())
	}
}

// TestHangUpDuringClaim (issue 30): clients that hang up while their
// claims are on their way to Redis (paused) do not cancel them: a SET
// written cannot be unsent, and one still queued behind others would be
// sent a moment later. Each claim stands, each request is forwarded and
// settled as if its client had stayed, and nothing is left to clean up.
// Before the fix a hang-up cancelled the claims still queued in the store's
// pipeline (the fifth of eight onwards), and each became a background
// cleanup: work any client could cause for free.
func TestHangUpDuringClaim(t *testing.T) {
	const clients = 8
	srv := redistest.Start(t)
	e := newEnvOn(t, srv, created, nil)
	if r := e.do(req{user: "alice", key: "warm", body: `{}`}); r.status != http.StatusCreated {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	srv.Pause()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			// An empty body: the server watches the connection from the
			// start (with a body, only once it is read to its end).
			hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.front.URL+"/payments", http.NoBody)
			hr.Header.Set("X-Forwarded-User", "alice")
			hr.Header.Set("Idempotency-Key", fmt.Sprint("hang-up-", i))
			hr.Header.Set("Content-Type", "application/json")
			if res, err := http.DefaultClient.Do(hr); err == nil {
				res.Body.Close()
				t.Errorf("a client was answered %d while Redis was paused", res.StatusCode)
			}
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond) // the claims are still within their confirm window
	srv.Resume()
	e.quiesce()
	poll.Until(t, "no cleanup pending", func() bool { return e.gauge("idemproxy_unconfirmed_claims_pending") == 0 })
	if n := e.unconfirmedTotal(); n != 0 {
		t.Errorf("%v claims cleaned up after hang-ups, want 0", n)
	}
	for i := range clients {
		r := e.do(req{user: "alice", key: fmt.Sprint("hang-up-", i)})
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry %d: %d replayed=%q, want the first attempt's 201 replayed", i, r.status, r.header.Get("Idempotent-Replayed"))
		}
	}
	if n := e.ledger.Total(); n != 1+clients {
		t.Fatalf("upstream executed %d times, want %d (warm-up, each hung-up request once)", n, 1+clients)
	}
}
