package proxy_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
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

// deliverGitHub sends body as GitHub delivery id of event check_run,
// signed with secret.
func deliverGitHub(t *testing.T, e *env, secret, id, body string) (int, string, http.Header) {
	t.Helper()
	return deliver(t, e, "/webhooks/github", body, map[string]string{
		"X-Hub-Signature-256": "sha256=" + hex.EncodeToString(hmacSum(secret, body)),
		"X-GitHub-Delivery":   id,
		"X-GitHub-Event":      "check_run",
	})
}

func hmacSum(secret, body string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return m.Sum(nil)
}

// deliver posts body to path with headers.
func deliver(t *testing.T, e *env, path, body string, headers map[string]string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.front.URL+path, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// TestWebhookKeysOfThePreviousReleases (issue 41, item 1; issue 53):
// v0.5.0 keyed a GitHub delivery by its (unsigned) delivery id, and a
// webhook route by the scope it inherited; v0.6.0 by the body's SHA-256
// alone. A redelivery whose first delivery was stored so is answered
// from that record, not executed again, for one retention after the store
// first served the keys that replaced it; after that the old key is no
// longer read. The record an earlier release would have written is made
// by moving this release's record to the old key (the fingerprint is the
// same in every release: fleet/'s TestWebhookRedeliveryAcrossTheUpgrade
// runs the previous release itself).
func TestWebhookKeysOfThePreviousReleases(t *testing.T) {
	const secret = "gh-secret-0123"
	body := `{"action":"completed","check_run":{"id":7}}`
	sum := sha256.Sum256([]byte(body))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name   string
		shared bool          // the route inherited scope: principal (v0.5.0)
		v06    bool          // stored by v0.6.0: the digest alone, scoped by route
		marker time.Duration // how long ago the store first served the replacing keys; 0: now
		want   int           // executions after the redelivery
	}{
		{name: "v0.5.0, by delivery id", want: 1},
		{name: "v0.5.0, by delivery id, shared scope", shared: true, want: 1},
		{name: "v0.5.0, a retention after the change", marker: 25 * time.Hour, want: 2},
		{name: "v0.6.0, by the digest alone", v06: true, want: 1},
		{name: "v0.6.0, a retention after the change", v06: true, marker: 25 * time.Hour, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, created, func(c *setup) {
				r := githubRoute(secret)
				r.SharedScope = tc.shared
				c.Routes = []proxy.Route{r}
			})
			ctx := context.Background()
			if tc.marker > 0 {
				marker := "webhook-keys-v0.6"
				if tc.v06 {
					marker = "webhook-keys-v0.7"
				}
				e.rdb.Set(ctx, e.prefix+"since:"+marker, strconv.FormatInt(time.Now().Add(-tc.marker).UnixMilli(), 10), 0)
			}
			status, first, _ := deliverGitHub(t, e, secret, "dlv-1", body)
			if status != http.StatusCreated {
				t.Fatalf("first delivery: %d %s", status, first)
			}
			now := e.store.Codec().Key("webhook:github", proxy.KeyScope("github-events", false), eventKey(digest, "check_run"))
			old := e.store.Codec().Key("webhook:github", proxy.KeyScope("github-events", tc.shared), "dlv-1")
			if tc.v06 {
				old = e.store.Codec().Key("webhook:github", proxy.KeyScope("github-events", false), digest)
			}
			if err := e.rdb.Rename(ctx, now, old).Err(); err != nil {
				t.Fatalf("the delivery is not stored under its body's SHA-256 with its event, scoped by route: %v", err)
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

// TestShopifyKeyOfV080 (issue 78, item 4): v0.8.0 keyed a Shopify
// delivery by its body's digest, its topic and its shop's domain; the
// domain is unsigned and left the key. A redelivery whose first delivery
// v0.8.0 stored under the wide key is answered from that record for one
// retention after the store first served the new keys, then no longer
// read. The record v0.8.0 would have written is this release's, moved to
// the wide key (fleet/ runs v0.8.0 itself).
func TestShopifyKeyOfV080(t *testing.T) {
	const secret = "shpss_0123456789"
	body := `{"id":820982911946154508,"email":"jon@example.com","total_price":"10.00"}`
	sum := sha256.Sum256([]byte(body))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	headers := map[string]string{"X-Shopify-Hmac-Sha256": base64.StdEncoding.EncodeToString(hmacSum(secret, body)), "X-Shopify-Webhook-Id": "w1",
		"X-Shopify-Topic": "orders/create", "X-Shopify-Shop-Domain": "a.myshopify.com"}
	for _, tc := range []struct {
		name   string
		marker time.Duration // how long ago the store first served the new keys; 0: now
		want   int
	}{
		{name: "within a retention of the change", want: 1},
		{name: "a retention after the change", marker: 25 * time.Hour, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, created, func(c *setup) {
				r := route("hooks", "POST /webhooks/in")
				r.Webhook = &proxy.Webhook{Provider: proxy.WebhookShopify, Secrets: [][]byte{[]byte(secret)}}
				c.Routes = []proxy.Route{r}
			})
			ctx := context.Background()
			if tc.marker > 0 {
				e.rdb.Set(ctx, e.prefix+"since:webhook-keys-v0.9", strconv.FormatInt(time.Now().Add(-tc.marker).UnixMilli(), 10), 0)
			}
			status, first, _ := deliver(t, e, "/webhooks/in", body, headers)
			if status != http.StatusCreated {
				t.Fatalf("first delivery: %d %s", status, first)
			}
			scope := proxy.KeyScope("hooks", false)
			now := e.store.Codec().Key("webhook:shopify", scope, eventKey(digest, "orders/create"))
			wide := e.store.Codec().Key("webhook:shopify", scope, eventKey(digest, "orders/create", "a.myshopify.com"))
			if err := e.rdb.Rename(ctx, now, wide).Err(); err != nil {
				t.Fatalf("the delivery is not stored under its body's SHA-256 and its topic alone: %v", err)
			}
			status, again, h := deliver(t, e, "/webhooks/in", body, headers)
			if n := e.ledger.Total(); n != tc.want {
				t.Fatalf("the redelivery: %d %s replayed=%q; %d executions, want %d", status, again, h.Get("Idempotent-Replayed"), n, tc.want)
			}
			if tc.want == 1 && (again != first || h.Get("Idempotent-Replayed") != "true") {
				t.Errorf("the redelivery: %d %s, want the first answer replayed", status, again)
			}
		})
	}
}

// eventKey is the key of a delivery keyed by its body's digest and event:
// the digest, ":" and the first 128 bits of the SHA-256 of the event's
// parts, each length-prefixed (8 bytes, big-endian).
func eventKey(digest string, parts ...string) string {
	m := sha256.New()
	for _, p := range parts {
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(len(p))))
		m.Write([]byte(p))
	}
	return digest + ":" + hex.EncodeToString(m.Sum(nil)[:16])
}

// TestWebhookKeysNameTheEvent (issue 53): GitHub and Shopify sign only
// the body, and one body can be delivered under several topics
// (Shopify's orders/create and orders/paid can be byte-identical): each
// topic is a delivery of its own and reaches the app, while a delivery
// resent under a new delivery id is a redelivery and replays. 0fc8fae
// keyed by the body's digest alone: the second topic got the first one's
// answer and never reached the app (2 of 2).
func TestWebhookKeysNameTheEvent(t *testing.T) {
	const secret = "shpss_0123456789"
	body := `{"id":820982911946154508,"email":"jon@example.com","total_price":"10.00"}`
	github := func(id, event string) map[string]string {
		return map[string]string{"X-Hub-Signature-256": "sha256=" + hex.EncodeToString(hmacSum(secret, body)), "X-GitHub-Delivery": id, "X-GitHub-Event": event}
	}
	shopify := func(id, topic, shop string) map[string]string {
		return map[string]string{"X-Shopify-Hmac-Sha256": base64.StdEncoding.EncodeToString(hmacSum(secret, body)), "X-Shopify-Webhook-Id": id, "X-Shopify-Topic": topic, "X-Shopify-Shop-Domain": shop}
	}
	shopifyNew := func(id, topic, shop string) map[string]string { // the names without X-
		return map[string]string{"Shopify-Hmac-Sha256": base64.StdEncoding.EncodeToString(hmacSum(secret, body)), "Shopify-Webhook-Id": id, "Shopify-Topic": topic, "Shopify-Shop-Domain": shop}
	}
	for _, tc := range []struct {
		provider   string
		deliveries []map[string]string
		executions []int // after each delivery
	}{
		{proxy.WebhookGitHub, []map[string]string{
			github("d1", "issues"), github("d2", "issues"), github("d3", "issue_comment"), github("d4", "issue_comment"),
		}, []int{1, 1, 2, 2}},
		{proxy.WebhookShopify, []map[string]string{
			shopify("w1", "orders/create", "a.myshopify.com"),
			shopify("w2", "orders/paid", "a.myshopify.com"),
			shopify("w3", "orders/paid", "a.myshopify.com"),
			shopifyNew("w4", "orders/paid", "a.myshopify.com"),
			// Another shop's domain is no new delivery: the domain is
			// unsigned (issue 78; v0.8.0 executed it, once per domain).
			shopify("w5", "orders/paid", "b.myshopify.com"),
		}, []int{1, 2, 2, 2, 2}},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			e := newEnv(t, created, func(c *setup) {
				r := route("hooks", "POST /webhooks/in")
				r.Webhook = &proxy.Webhook{Provider: tc.provider, Secrets: [][]byte{[]byte(secret)}}
				c.Routes = []proxy.Route{r}
			})
			for i, h := range tc.deliveries {
				status, answer, header := deliver(t, e, "/webhooks/in", body, h)
				if status != http.StatusCreated {
					t.Fatalf("delivery %d (%v): %d %s", i+1, h, status, answer)
				}
				if n := e.ledger.Total(); n != tc.executions[i] {
					t.Fatalf("after delivery %d (%v): %d executions, want %d (replayed=%q)", i+1, h, n, tc.executions[i], header.Get("Idempotent-Replayed"))
				}
			}
		})
	}
}
