package proxy_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// githubRoute is a GitHub webhook route at /webhooks/github.
func githubRoute(secret string) proxy.Route {
	r := route("github-events", "POST /webhooks/github")
	r.Webhook = &proxy.Webhook{Provider: proxy.WebhookGitHub, Secrets: [][]byte{[]byte(secret)}}
	return r
}

// deliverGitHub sends body as GitHub delivery id, signed with secret.
func deliverGitHub(t *testing.T, e *env, secret, id, body string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.front.URL+"/webhooks/github", strings.NewReader(body))
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	req.Header.Set("X-GitHub-Delivery", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestWebhookKeysOfThePreviousRelease (issue 41, item 1): v0.5.0 keyed a
// GitHub delivery by its (unsigned) delivery id, and a webhook route by
// the scope it inherited. A redelivery whose first delivery was stored so
// is answered from that record, not executed again, for one retention
// after the store first served the new keys; after that the old key is no
// longer read. The record v0.5.0 would have written is made by moving
// this release's record to the old key (the fingerprint is the same in
// both releases: fleet/'s TestWebhookRedeliveryAcrossTheUpgrade runs
// v0.5.0 itself).
func TestWebhookKeysOfThePreviousRelease(t *testing.T) {
	const secret = "gh-secret-0123"
	body := `{"action":"completed","check_run":{"id":7}}`
	for _, tc := range []struct {
		name   string
		shared bool          // the route inherited scope: principal
		marker time.Duration // how long ago the store first served the new keys; 0: now
		want   int           // executions after the redelivery
	}{
		{name: "by delivery id", want: 1},
		{name: "by delivery id, shared scope", shared: true, want: 1},
		{name: "a retention after the change", marker: 25 * time.Hour, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, created, func(c *setup) {
				r := githubRoute(secret)
				r.SharedScope = tc.shared
				c.Routes = []proxy.Route{r}
			})
			ctx := context.Background()
			if tc.marker > 0 {
				e.rdb.Set(ctx, e.prefix+"since:webhook-keys-v0.6", strconv.FormatInt(time.Now().Add(-tc.marker).UnixMilli(), 10), 0)
			}
			status, first, _ := deliverGitHub(t, e, secret, "dlv-1", body)
			if status != http.StatusCreated {
				t.Fatalf("first delivery: %d %s", status, first)
			}
			sum := sha256.Sum256([]byte(body))
			now := e.store.Key("webhook:github", proxy.KeyScope("github-events", false), "sha256:"+hex.EncodeToString(sum[:]))
			old := e.store.Key("webhook:github", proxy.KeyScope("github-events", tc.shared), "dlv-1")
			if err := e.rdb.Rename(ctx, now, old).Err(); err != nil {
				t.Fatalf("the delivery is not stored under its body's SHA-256, scoped by route: %v", err)
			}
			status, again, h := deliverGitHub(t, e, secret, "dlv-1", body)
			if n := e.ledger.Total(); n != tc.want {
				t.Fatalf("the redelivery: %d %s replayed=%q; %d executions, want %d", status, again, h.Get("Idempotent-Replayed"), n, tc.want)
			}
			if tc.want == 1 && (again != first || h.Get("Idempotent-Replayed") != "true") {
				t.Errorf("the redelivery: %d %s, want the first answer replayed", status, again)
			}
		})
	}
}
