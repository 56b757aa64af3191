package e2e

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// signer signs a delivery as one provider does: the headers for body.
type signer func(secret, id, body string, at time.Time) http.Header

func hmacHex(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

func hmacB64(key []byte, msg string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// The providers' published formats (stripe-go's own helper signs in
// compat/, TestStripeWebhook).
var signers = map[string]signer{
	"stripe": func(secret, _, body string, at time.Time) http.Header {
		t := strconv.FormatInt(at.Unix(), 10)
		return http.Header{"Stripe-Signature": {"t=" + t + ",v1=" + hmacHex(secret, t+"."+body)}}
	},
	"github": func(secret, id, body string, _ time.Time) http.Header {
		return http.Header{"X-Hub-Signature-256": {"sha256=" + hmacHex(secret, body)}, "X-Github-Delivery": {id}, "X-Github-Event": {"push"}}
	},
	"shopify": func(secret, id, body string, _ time.Time) http.Header {
		return http.Header{"X-Shopify-Hmac-Sha256": {hmacB64([]byte(secret), body)}, "X-Shopify-Webhook-Id": {id}, "X-Shopify-Topic": {"orders/create"}, "X-Shopify-Shop-Domain": {"shop-1.myshopify.com"}}
	},
	"standard": func(secret, id, body string, at time.Time) http.Header {
		key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		t := strconv.FormatInt(at.Unix(), 10)
		return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {t}, "Webhook-Signature": {"v1," + hmacB64(key, id+"."+t+"."+body)}}
	},
	// Svix, the reference sender of Standard Webhooks, and Shopify's
	// current library send other header names (issue 41).
	"svix": func(secret, id, body string, at time.Time) http.Header {
		key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		t := strconv.FormatInt(at.Unix(), 10)
		return http.Header{"Svix-Id": {id}, "Svix-Timestamp": {t}, "Svix-Signature": {"v1," + hmacB64(key, id+"."+t+"."+body)}}
	},
	"shopify-bare": func(secret, id, body string, _ time.Time) http.Header {
		return http.Header{"Shopify-Hmac-Sha256": {hmacB64([]byte(secret), body)}, "Shopify-Webhook-Id": {id}, "Shopify-Topic": {"orders/create"}, "Shopify-Shop-Domain": {"shop-1.myshopify.com"}}
	},
}

// providerOf is the provider a signer's route is configured with.
func providerOf(signer string) string {
	switch signer {
	case "svix":
		return "standard"
	case "shopify-bare":
		return "shopify"
	}
	return signer
}

// TestWebhooksThroughTheBinary (issue 34): for each provider, through the
// real binary, from a peer that is not trusted and sends no identity: a
// signed delivery executes the handler once; a redelivery (signed anew)
// gets the first answer, replayed; five concurrent redeliveries execute
// nothing more; the first delivery resent under a new, unsigned delivery
// id is a redelivery too, its key being what is signed (issue 41); a forged first delivery of a new id is 401 and does not
// poison the id (the real one executes after); a stale timestamp is 401
// (stripe, standard); the second secret of a rotation verifies too.
func TestWebhooksThroughTheBinary(t *testing.T) {
	var mu sync.Mutex
	executed := map[string]int{}
	keys := map[string]string{} // the key the upstream got, by path and event
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var event struct{ ID string }
		json.Unmarshal(b, &event)
		key := r.URL.Path + " " + event.ID // what the app books: the event
		mu.Lock()
		executed[key]++
		n := executed[key]
		keys[key] = r.Header.Get("Idempotency-Key")
		mu.Unlock()
		if r.Header.Get("X-Forwarded-User") != "" {
			http.Error(w, "an untrusted peer's identity reached the app", http.StatusTeapot)
			return
		}
		fmt.Fprintf(w, `{"booked":%q,"n":%d}`, string(b), n)
	}))
	defer upstream.Close()
	dir := t.TempDir()
	secrets := map[string][2]string{
		"stripe":   {"whsec_old_0123456789abcdef", "whsec_new_0123456789abcdef"},
		"github":   {"gh-old-secret-0123", "gh-new-secret-0123"},
		"shopify":  {"shp-old-secret-0123", "shp-new-secret-0123"},
		"standard": {"whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-old-key-0123456789")), "whsec_" + base64.StdEncoding.EncodeToString([]byte("standard-new-key-0123456789"))},

		"svix":         {"whsec_" + base64.StdEncoding.EncodeToString([]byte("svix-old-key-0123456789")), "whsec_" + base64.StdEncoding.EncodeToString([]byte("svix-new-key-0123456789"))},
		"shopify-bare": {"shpb-old-secret-0123", "shpb-new-secret-0123"},
	}
	var routes strings.Builder
	for _, p := range []string{"stripe", "github", "shopify", "standard", "svix", "shopify-bare"} {
		var files []string
		for i, s := range secrets[p] {
			f := filepath.Join(dir, fmt.Sprintf("%s-%d", p, i))
			if err := os.WriteFile(f, []byte(s+"\n"), 0o400); err != nil {
				t.Fatal(err)
			}
			files = append(files, strconv.Quote(f))
		}
		fmt.Fprintf(&routes, "  - name: %s-events\n    match: \"POST /webhooks/%s\"\n    webhook:\n      provider: %s\n      secret_files: [%s]\n      tolerance: 5m\n", p, p, providerOf(p), strings.Join(files, ", "))
	}
	sc := startBinary(t, fmt.Sprintf("upstream:\n  url: %q\nidentity:\n  trusted_proxies: [\"192.0.2.0/24\"]\nroutes:\n%s", upstream.URL, routes.String()))

	deliver := func(provider, secret, id, body string, at time.Time) (int, string, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, sc.Client+"/webhooks/"+provider, strings.NewReader(body))
		for k, vs := range signers[provider](secret, id, body, at) {
			req.Header[k] = vs
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-User", "mallory") // from an untrusted peer: stripped
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	for _, p := range []string{"stripe", "github", "shopify", "standard", "svix", "shopify-bare"} {
		t.Run(p, func(t *testing.T) {
			old, cur := secrets[p][0], secrets[p][1]
			body := func(id string) string { return fmt.Sprintf(`{"id":%q,"type":"payment.succeeded","amount":4200}`, id) }
			now := time.Now()
			status, first, _ := deliver(p, cur, "evt_1", body("evt_1"), now)
			if status != http.StatusOK || !strings.Contains(first, `"n":1`) {
				t.Fatalf("first delivery: %d %s", status, first)
			}
			status, again, h := deliver(p, old, "evt_1", body("evt_1"), now.Add(30*time.Second)) // re-signed, with the older secret
			if status != http.StatusOK || again != first || h.Get("Idempotent-Replayed") != "true" {
				t.Errorf("redelivery: %d %s replayed=%q, want the first answer replayed", status, again, h.Get("Idempotent-Replayed"))
			}
			var wg sync.WaitGroup
			for range 5 {
				wg.Go(func() { deliver(p, cur, "evt_1", body("evt_1"), time.Now()) })
			}
			wg.Wait()
			if p != "standard" && p != "svix" {
				// A captured delivery resent under a fresh delivery id:
				// GitHub and Shopify do not sign the id, Stripe has none
				// besides the body's (Standard Webhooks signs it: a new
				// id needs the secret).
				status, again, h := deliver(p, cur, "evt_1-resent", body("evt_1"), time.Now())
				if status != http.StatusOK || again != first || h.Get("Idempotent-Replayed") != "true" {
					t.Errorf("the first delivery resent under a new id: %d %s replayed=%q, want the first answer replayed", status, again, h.Get("Idempotent-Replayed"))
				}
			}
			if status, b, _ := deliver(p, "not-the-secret-0123", "evt_2", body("evt_2"), now); status != http.StatusUnauthorized || !strings.Contains(b, "signature-invalid") {
				t.Errorf("a forged first delivery: %d %s, want 401 signature-invalid", status, b)
			}
			if status, b, _ := deliver(p, cur, "evt_2", body("evt_2"), now); status != http.StatusOK || !strings.Contains(b, `"n":1`) {
				t.Errorf("the real delivery after a forged one: %d %s, want it executed", status, b)
			}
			if p == "stripe" || p == "standard" || p == "svix" {
				if status, b, _ := deliver(p, cur, "evt_3", body("evt_3"), now.Add(-10*time.Minute)); status != http.StatusUnauthorized || !strings.Contains(b, "tolerance") {
					t.Errorf("a stale timestamp: %d %s, want 401 naming the tolerance", status, b)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range []string{"evt_1", "evt_2"} {
				if n := executed["/webhooks/"+p+" "+id]; n != 1 {
					t.Errorf("%s executed %d times, want 1", id, n)
				}
			}
			// The key is what the provider signs, and the upstream gets it.
			want := "evt_1"
			switch p {
			case "github":
				want = bodyKey(body("evt_1"))
			case "shopify", "shopify-bare":
				want = eventKey(body("evt_1"), "orders/create")
			}
			if got := keys["/webhooks/"+p+" evt_1"]; got != want {
				t.Errorf("the upstream got Idempotency-Key %q, want %q", got, want)
			}
			if n := executed["/webhooks/"+p+" evt_3"]; n != 0 {
				t.Errorf("a stale delivery executed %d times", n)
			}
		})
	}
	text := scrape(t, sc.Admin)
	for _, want := range []string{
		`idemproxy_webhook_deliveries_total{result="executed",route="github-events"} 2`,
		`idemproxy_webhook_deliveries_total{result="signature_invalid",route="stripe-events"} 2`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// githubDelivery is a GitHub delivery of body signed with secret, as a
// request to the sidecar's /webhooks/github.
func githubDelivery(t *testing.T, base, secret, id, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/webhooks/github", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range signers["github"](secret, id, body, time.Now()) {
		req.Header[k] = vs
	}
	return req
}

// bodyKey is the key of a GitHub push delivery of body (signers).
func bodyKey(body string) string { return eventKey(body, "push") }

// eventKey is the key of a delivery keyed by its body's SHA-256 and what
// it is about (GitHub's event; Shopify's topic and shop): the body's
// digest, ":" and the first 128 bits of the SHA-256 of the event's
// parts, each length-prefixed (8 bytes, big-endian).
func eventKey(body string, parts ...string) string {
	sum := sha256.Sum256([]byte(body))
	m := sha256.New()
	for _, p := range parts {
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(len(p))))
		m.Write([]byte(p))
	}
	return "sha256:" + hex.EncodeToString(sum[:]) + ":" + hex.EncodeToString(m.Sum(nil)[:16])
}

// TestUnsignedBodiesCountAgainstTheirSender (issue 41, item 2): an outside
// peer holding many unsigned bodies open fills its own share of
// limits.max_buffered_bytes, not the provider's, so a real, signed
// delivery from another address goes through meanwhile (before: 429
// too-many-bytes, and GitHub does not redeliver on its own). And a stale
// signed timestamp is refused before the body is read: a sender of one
// gets 401 while its body has not come.
func TestUnsignedBodiesCountAgainstTheirSender(t *testing.T) {
	up := binarytest.NewRecorder(t)
	dir := t.TempDir()
	ghSecret, stripeSecret := filepath.Join(dir, "gh"), filepath.Join(dir, "stripe")
	if err := os.WriteFile(ghSecret, []byte("gh-secret-0123"), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stripeSecret, []byte("whsec_0123456789abcdef"), 0o400); err != nil {
		t.Fatal(err)
	}
	const budget, share = 1 << 20, 256 << 10 // 25%: eight 32 KiB buffers
	sc := startBinary(t, fmt.Sprintf(`upstream:
  url: %q
identity:
  trusted_proxies: ["192.0.2.0/24"]
client:
  body_timeout: 10s
limits:
  max_buffered_bytes: %d
  principal_share: 25%%
routes:
  - name: github-events
    match: "POST /webhooks/github"
    webhook: {provider: github, secret_files: [%q]}
  - name: stripe-events
    match: "POST /webhooks/stripe"
    webhook: {provider: stripe, secret_files: [%q]}
`, up.URL, budget, ghSecret, stripeSecret))
	addr := strings.TrimPrefix(sc.Client, "http://")
	from := func(ip string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// 12 bodies of 30,000 declared bytes, 20,000 sent, each signed with
	// nothing that verifies, from 127.0.0.2.
	for i := range 12 {
		c := from("127.0.0.2")
		fmt.Fprintf(c, "POST /webhooks/github HTTP/1.1\r\nHost: x\r\nX-Hub-Signature-256: sha256=%s\r\nX-GitHub-Delivery: forged-%d\r\nContent-Length: 30000\r\n\r\n%s",
			strings.Repeat("ab", 32), i, strings.Repeat("x", 20000))
	}
	poll.Until(t, "the outsider's bodies fill its share", func() bool {
		return metric(t, sc.Admin, fmt.Sprintf("idemproxy_buffered_bytes %d\n", share))
	})
	// The real delivery, from 127.0.0.3.
	body := `{"action":"completed","check_run":{"id":42}}`
	client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}).DialContext}}
	resp, err := client.Do(githubDelivery(t, sc.Client, "gh-secret-0123", "real-1", body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || up.Executions(bodyKey(body)) != 1 {
		t.Fatalf("a signed delivery while an outsider holds unsigned bodies: %d %s, executed %d times; want 201, once", resp.StatusCode, b, up.Executions(bodyKey(body)))
	}
	if !metric(t, sc.Admin, fmt.Sprintf("idemproxy_buffered_bytes %d\n", share)) {
		t.Errorf("the outsider's share changed while the real delivery ran:\n%s", scrape(t, sc.Admin))
	}

	// A stale Stripe timestamp, its body not sent: refused from the
	// headers, not after the body (which would never come).
	c := from("127.0.0.4")
	stale := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	fmt.Fprintf(c, "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: t=%s,v1=%s\r\nContent-Length: 30000\r\n\r\n", stale, strings.Repeat("ab", 32))
	answer, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(answer.Body)
	if answer.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "tolerance") {
		t.Errorf("a stale timestamp before its body: %d %s, want 401 naming the tolerance", answer.StatusCode, b)
	}
	if up.Total() != 1 {
		t.Errorf("the upstream ran %d times, want once", up.Total())
	}
}

// TestWebhookRouteSettings (issue 41, item 3), through the binary, with
// defaults meant for clients' keys: a webhook route takes no new-key quota
// and the whole in-flight share unless it sets them (-check warns that the
// quota is not inherited), is scoped by route even under
// defaults.scope: principal, and runs the key-header checks; and no
// identity may assert a webhook: principal.
func TestWebhookRouteSettings(t *testing.T) {
	var mu sync.Mutex
	arrived := 0
	both := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "slow") {
			// Held until the other slow delivery is forwarded too.
			mu.Lock()
			if arrived++; arrived == 2 {
				close(both)
			}
			mu.Unlock()
			select {
			case <-both:
			case <-time.After(5 * time.Second):
			}
		}
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, `{"route":%q,"event":%s}`, r.URL.Path, b)
	}))
	defer upstream.Close()
	const secret = "whsec_0123456789abcdef"
	file := filepath.Join(t.TempDir(), "whsec")
	if err := os.WriteFile(file, []byte(secret), 0o400); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`upstream:
  url: %q
defaults:
  scope: principal
  max_in_flight: 2
  quota:
    new_keys: 2
routes:
  - name: stripe-a
    match: "POST /webhooks/a"
    webhook: {provider: stripe, secret_files: [%q]}
  - name: stripe-b
    match: "POST /webhooks/b"
    webhook: {provider: stripe, secret_files: [%q]}
  - name: pay
    match: "POST /payments"
`, upstream.URL, file, file)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(buildBinary(t), "-config", path, "-check").CombinedOutput()
	if err != nil {
		t.Fatalf("-check: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "warning: routes[0].quota.new_keys: not set, so defaults.quota.new_keys (2) does not apply to this webhook route (stripe-a)") {
		t.Errorf("-check does not warn that the quota is not inherited:\n%s", out)
	}
	sc := startBinary(t, yaml)
	send := func(route, event string, extra http.Header) (int, string) {
		t.Helper()
		body := fmt.Sprintf(`{"id":%q}`, event)
		req, _ := http.NewRequest(http.MethodPost, sc.Client+"/webhooks/"+route, strings.NewReader(body))
		for k, vs := range signers["stripe"](secret, "", body, time.Now()) {
			req.Header[k] = vs
		}
		for k, vs := range extra {
			req.Header[k] = vs
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for i := range 4 {
		if status, b := send("a", fmt.Sprintf("evt_%d", i), nil); status != http.StatusOK {
			t.Fatalf("event %d of a provider under defaults.quota.new_keys 2: %d %s, want 200", i, status, b)
		}
	}
	if status, b := send("b", "evt_0", nil); status != http.StatusOK || !strings.Contains(b, `"route":"/webhooks/b"`) {
		t.Errorf("the same event id on another webhook route: %d %s, want its own execution (scoped by route)", status, b)
	}
	var wg sync.WaitGroup
	var statuses [2]int
	for i := range 2 {
		wg.Go(func() { statuses[i], _ = send("a", fmt.Sprintf("slow_%d", i), nil) })
	}
	wg.Wait()
	if statuses != [2]int{200, 200} {
		t.Errorf("two deliveries in flight on a route with max_in_flight 2: %v, want both forwarded (the provider's share is the whole)", statuses)
	}
	for _, tc := range []struct {
		name  string
		extra http.Header
		want  string
	}{
		{"the key header nominated hop-by-hop", http.Header{"Connection": {"Idempotency-Key"}}, "hop-by-hop"},
		{"the key header under another spelling", http.Header{"Idempotency_key": {"k"}}, "key-malformed"},
	} {
		if status, b := send("a", "evt_h", tc.extra); status != http.StatusBadRequest || !strings.Contains(b, tc.want) {
			t.Errorf("%s on a webhook route: %d %s, want 400 %s", tc.name, status, b, tc.want)
		}
	}
	// A trusted peer (loopback) asserting a provider's principal.
	if resp, b := postAnswerAs(t, sc.Client+"/payments", "webhook:stripe", "k-1", `{}`); resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, "identity-invalid") {
		t.Errorf("X-Forwarded-User: webhook:stripe: %d %s, want 400 identity-invalid", resp.StatusCode, b)
	}
}

// TestCapturedDeliveryExecutesOncePerEvent (issue 63, security): GitHub's
// and Shopify's event headers are not signed, and a captured delivery
// resent under another spelling of them (letter case, an invented event,
// none, two, both header names, the shop domain's case) executed once per
// variant (13 of 13 on v0.7.0). Through the binary: each header must appear
// once, in the provider's form (400 event-malformed), and be one of the
// route's webhook.events (400 event-not-accepted), all after the
// signature and before any claim: a captured body executes at most once
// per listed event. The same topic under Shopify's other header name, or
// under another shop's domain (unsigned: out of the key since issue 78),
// is the same delivery (replayed). A route without events draws a -check
// warning.
func TestCapturedDeliveryExecutesOncePerEvent(t *testing.T) {
	t.Parallel()
	up := binarytest.NewRecorder(t)
	dir := t.TempDir()
	gh, shp := filepath.Join(dir, "gh"), filepath.Join(dir, "shp")
	for f, s := range map[string]string{gh: "gh-secret-0123", shp: "shp-secret-0123"} {
		if err := os.WriteFile(f, []byte(s), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf(`upstream:
  url: %q
routes:
  - name: github-events
    match: "POST /webhooks/github"
    webhook: {provider: github, secret_files: [%q], events: [push, issues]}
  - name: shopify-events
    match: "POST /webhooks/shopify"
    webhook: {provider: shopify, secret_files: [%q], events: [orders/create]}
`, up.URL, gh, shp)
	sc := startBinary(t, cfg)
	const body = `{"id":"captured","amount":4200}`
	deliver := func(path string, h http.Header) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, sc.Client+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	github := func(events ...string) http.Header {
		h := http.Header{"X-Hub-Signature-256": {"sha256=" + hmacHex("gh-secret-0123", body)}, "X-Github-Delivery": {fmt.Sprint("d-", time.Now().UnixNano())}}
		if events != nil {
			h["X-Github-Event"] = events
		}
		return h
	}
	shopify := func(extra map[string][]string) http.Header {
		h := http.Header{"X-Shopify-Hmac-Sha256": {hmacB64([]byte("shp-secret-0123"), body)}, "X-Shopify-Webhook-Id": {fmt.Sprint("w-", time.Now().UnixNano())}}
		for k, v := range extra {
			if v == nil {
				delete(h, k)
				continue
			}
			h[k] = v
		}
		return h
	}
	topic, shop := "X-Shopify-Topic", "X-Shopify-Shop-Domain"
	cases := []struct {
		name, path string
		h          http.Header
		want       int
		problem    string
	}{
		{"github push", "/webhooks/github", github("push"), http.StatusCreated, ""},
		{"github push again", "/webhooks/github", github("push"), http.StatusCreated, ""},
		{"github issues (listed)", "/webhooks/github", github("issues"), http.StatusCreated, ""},
		{"github Push", "/webhooks/github", github("Push"), http.StatusBadRequest, "event-malformed"},
		{"github PUSH", "/webhooks/github", github("PUSH"), http.StatusBadRequest, "event-malformed"},
		{"github push-hook", "/webhooks/github", github("push-hook"), http.StatusBadRequest, "event-malformed"},
		{"github invented", "/webhooks/github", github("invented_event"), http.StatusBadRequest, "event-not-accepted"},
		{"github no event", "/webhooks/github", github(), http.StatusBadRequest, "event-malformed"},
		{"github two events", "/webhooks/github", github("push", "push"), http.StatusBadRequest, "event-malformed"},
		{"github push and issues", "/webhooks/github", github("push", "issues"), http.StatusBadRequest, "event-malformed"},
		{"shopify orders/create", "/webhooks/shopify", shopify(map[string][]string{topic: {"orders/create"}, shop: {"shop-1.myshopify.com"}}), http.StatusCreated, ""},
		{"shopify, the other header names", "/webhooks/shopify", shopify(map[string][]string{"Shopify-Topic": {"orders/create"}, "Shopify-Shop-Domain": {"shop-1.myshopify.com"}}), http.StatusCreated, ""},
		{"shopify, both header names", "/webhooks/shopify", shopify(map[string][]string{topic: {"orders/create"}, "Shopify-Topic": {"orders/create"}, shop: {"shop-1.myshopify.com"}}), http.StatusBadRequest, "event-malformed"},
		{"shopify, the shop's case", "/webhooks/shopify", shopify(map[string][]string{topic: {"orders/create"}, shop: {"Shop-1.myshopify.com"}}), http.StatusBadRequest, "event-malformed"},
		{"shopify, the topic's case", "/webhooks/shopify", shopify(map[string][]string{topic: {"Orders/Create"}, shop: {"shop-1.myshopify.com"}}), http.StatusBadRequest, "event-malformed"},
		{"shopify, another topic", "/webhooks/shopify", shopify(map[string][]string{topic: {"orders/paid"}, shop: {"shop-1.myshopify.com"}}), http.StatusBadRequest, "event-not-accepted"},
		{"shopify, no shop", "/webhooks/shopify", shopify(map[string][]string{topic: {"orders/create"}}), http.StatusBadRequest, "event-malformed"},
		{"shopify, no topic", "/webhooks/shopify", shopify(map[string][]string{shop: {"shop-1.myshopify.com"}}), http.StatusBadRequest, "event-malformed"},
	}
	// The shop's domain is unsigned too (issue 78): the same captured
	// delivery under seven invented domains is the same delivery,
	// replayed (v0.8.0 executed it once per domain: 7 of 7).
	for i := range 7 {
		cases = append(cases, struct {
			name, path string
			h          http.Header
			want       int
			problem    string
		}{fmt.Sprintf("shopify, invented shop %d", i), "/webhooks/shopify", shopify(map[string][]string{topic: {"orders/create"}, shop: {fmt.Sprintf("invented-%d.myshopify.com", i)}}), http.StatusCreated, ""})
	}
	for _, tc := range cases {
		st, b := deliver(tc.path, tc.h)
		if st != tc.want || !strings.Contains(b, tc.problem) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, st, b, tc.want, tc.problem)
		}
	}
	if n := up.Total(); n != 3 {
		t.Errorf("the captured body executed %d times, want 3: once per listed GitHub event (push, issues), once for Shopify's orders/create", n)
	}

	// -check warns for a GitHub or Shopify route that lists no events.
	path := filepath.Join(dir, "open.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(cfg, ", events: [push, issues]", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binarytest.TestBinary(t), "-config", path, "-check").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "routes[0].webhook.events: not set") {
		t.Errorf("-check of a GitHub route without events: %v\n%s\nwant a warning naming routes[0].webhook.events", err, out)
	}
}
