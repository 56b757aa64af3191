package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestClaimsThatNeverForwarded: a claim left in Redis by a sidecar that
// died is answered by what can be known of it. One whose SET ran well
// after it was sent (its reply came too late for its owner to forward:
// Redis stalled) is freed by the next attempt, which executes at once,
// under fail and keep. One confirmed in time whose owner died before
// forwarding cannot be told from one that died after: under fail (the
// default) the retries get 409 for the lease, then 502 outcome-unknown;
// under keep they execute after the lease. Both as the README documents.
func TestClaimsThatNeverForwarded(t *testing.T) {
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
			dead := &claim.Record{State: claim.InProgress, Created: time.Now(), Fingerprint: e.probeFingerprint(), RequestID: "dead"}
			if tc.late {
				dead.Created = time.Now().Add(-3 * time.Second)
			}
			if tc.unknown == proxy.Fail {
				dead.Tail = time.Hour
			}
			key := e.store.Key("alice", proxy.KeyScope("pay", false), "k")
			if res, err := e.store.Claim(context.Background(), key, dead, time.Second, claim.Quota{}); err != nil || !res.Claimed {
				t.Fatalf("dead sidecar's claim: %+v %v", res, err)
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
