package compat

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
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

	retryablehttp "github.com/hashicorp/go-retryablehttp"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	stripe "github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-go/v82/webhook"
	svix "github.com/svix/svix-webhooks/go"

	"github.com/idemproxy/idemproxy/internal/binarytest"
)

// stripeBody is the problem_body the README recommends for clients that
// read errors in Stripe's shape.
// stripe-go raises on any error in that shape, and retries an API error
// only when it is a 429 lock_timeout: so the in-progress answer is a 429
// (in_progress_status) with that code, and a concurrent retry waits for
// the first attempt instead of failing.
const stripeBody = `{"error":{"type":"idempotency_error","code":{{if eq .Code "request-in-progress"}}"lock_timeout"{{else}}{{json .Code}}{{end}},"message":{{json .Detail}},"request_id":{{json .RequestID}}}}`

// binaryEnv names an idemproxy binary already built (CI builds it once
// for every stage); without it the suite builds the repository's.
const binaryEnv = "IDEMPROXY_BINARY"

// TestMain removes the binary binarytest built, if it built one.
func TestMain(m *testing.M) {
	code := m.Run()
	binarytest.Cleanup()
	os.Exit(code)
}

// binary is the idemproxy binary: IDEMPROXY_BINARY's, or the repository's
// built once (binarytest.Binary).
func binary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(binaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s: %v", binaryEnv, err)
		}
		return bin
	}
	bin, err := binarytest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ledger is a Stripe-like upstream: POST /v1/charges creates a charge,
// counted per idempotency key. The key's prefix says how it fails, so that
// a client driven from another language triggers the same scenarios:
// reset-* drops the connection after acting (once), busy-* answers 503
// without acting (once), slow-* answers after 400 ms, timeout-* after 1 s
// (longer than those clients' timeouts).
type ledger struct {
	mu    sync.Mutex
	execs map[string]int
	seen  map[string]bool
	n     int
}

func newLedger() *ledger { return &ledger{execs: map[string]int{}, seen: map[string]bool{}} }

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	first := !l.seen[key]
	l.seen[key] = true
	if strings.HasPrefix(key, "busy-") && first {
		l.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"type":"api_error","code":"upstream_busy","message":"busy"}}`)
		return
	}
	l.execs[key]++
	l.n++
	id := fmt.Sprintf("ch_%d", l.n)
	l.mu.Unlock()
	switch {
	case strings.HasPrefix(key, "slow-"):
		time.Sleep(400 * time.Millisecond)
	case strings.HasPrefix(key, "timeout-"):
		time.Sleep(time.Second)
	case strings.HasPrefix(key, "reset-") && first:
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q,"object":"charge","amount":100,"currency":"usd"}`, id)
}

// executions is how often the upstream acted for each key.
func (l *ledger) executions() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.execs)
}

// sidecar runs the binary in front of l with route settings extra.
func sidecar(t *testing.T, l *ledger, extra string) string {
	t.Helper()
	return sidecarRoutes(t, l, extra, "  - name: charges\n    match: \"POST /v1/charges\"\n")
}

// sidecarRoutes is sidecar with routes of its own.
func sidecarRoutes(t *testing.T, l *ledger, extra, routes string) string {
	t.Helper()
	return sidecarFor(t, l, extra, routes)
}

// sidecarFor is sidecarRoutes in front of any upstream.
func sidecarFor(t *testing.T, upstream http.Handler, extra, routes string) string {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	yaml := fmt.Sprintf(`upstream:
  url: %q
defaults:
  lease: 2s
%sroutes:
%s`, up.URL, extra, routes)
	return binarytest.StartT(t, binary(t), yaml).Client
}

// calls is what a client library handed its application, per scenario and
// call: "charge <id>", "error <code>" (the library raised) or
// "response <status> <code>" (it returned the answer without raising).
type calls map[string][]string

// malformedKey opens a quoted key (RFC 8941 sf-string) without closing
// it: idemproxy answers 400 key-malformed, and no client checks it first
// (stripe-go refuses keys over 255 characters itself).
const malformedKey = `"unterminated`

// call makes one logical call with a client library: key, amount, and a
// client timeout (zero: the library's default).
type call func(key string, amount int64, timeout time.Duration) string

// scenarios runs the suite with do, as the Node and Python drivers do:
// a plain call, its replay, the key reused with another body, a malformed
// key, an upstream reset after acting, a 503 then 200 (the application
// retries once if the library did not), two concurrent calls with one key,
// and a client timeout shorter than the upstream.
func scenarios(do call) calls {
	got := calls{}
	got["plain"] = []string{do("plain-1", 100, 0)}
	got["replay"] = []string{do("plain-1", 100, 0)}
	got["reused"] = []string{do("plain-1", 999, 0)}
	got["malformed"] = []string{do(malformedKey, 100, 0)}
	got["reset"] = []string{do("reset-1", 100, 0)}
	got["busy"] = []string{do("busy-1", 100, 0)}
	if !strings.HasPrefix(got["busy"][0], "charge") {
		got["busy"] = append(got["busy"], do("busy-1", 100, 0))
	}
	got["concurrent"] = make([]string, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { got["concurrent"][i] = do("slow-1", 100, 0) })
	}
	wg.Wait()
	got["timeout"] = []string{do("timeout-1", 100, 300*time.Millisecond)}
	return got
}

// check compares got with want, where "charge" stands for any charge; the
// replay must be the plain call's charge and the concurrent calls one
// charge. Every key must have executed once at the upstream (the
// malformed one never).
func check(t *testing.T, l *ledger, got, want calls) {
	t.Helper()
	for scenario, w := range want {
		g := got[scenario]
		ok := len(g) == len(w)
		for i := 0; ok && i < len(w); i++ {
			ok = g[i] == w[i] || w[i] == "charge" && strings.HasPrefix(g[i], "charge ch_")
		}
		if !ok {
			t.Errorf("%s: the application got %q, want %q", scenario, g, w)
		}
	}
	if p, r := got["plain"], got["replay"]; len(p) == 1 && len(r) == 1 && p[0] != r[0] {
		t.Errorf("the replay got %q, the plain call %q: want the same charge", r[0], p[0])
	}
	if c := got["concurrent"]; len(c) == 2 && c[0] != c[1] {
		t.Errorf("two concurrent calls with one key got %q and %q: want one charge", c[0], c[1])
	}
	execs := l.executions()
	for _, key := range []string{"plain-1", "reset-1", "busy-1", "slow-1", "timeout-1"} {
		if execs[key] != 1 {
			t.Errorf("key %s executed %d times at the upstream, want 1", key, execs[key])
		}
	}
	if n := execs[malformedKey]; n != 0 {
		t.Errorf("the malformed key executed %d times, want 0", n)
	}
}

// stripeGo is stripe-go v82 with its default retries (3 here, as in its
// docs' examples).
func stripeGo(url string) call {
	backend := func(timeout time.Duration) *stripe.Client {
		cfg := &stripe.BackendConfig{
			URL:               stripe.String(url),
			MaxNetworkRetries: stripe.Int64(3),
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		}
		if timeout > 0 {
			cfg.HTTPClient = &http.Client{Timeout: timeout}
		}
		return stripe.NewClient("sk_test_compat", stripe.WithBackends(stripe.NewBackendsWithConfig(cfg)))
	}
	return func(key string, amount int64, timeout time.Duration) string {
		p := &stripe.ChargeCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd")}
		p.SetIdempotencyKey(key)
		p.Headers = http.Header{"X-Forwarded-User": {"merchant-1"}}
		ch, err := backend(timeout).V1Charges.Create(context.Background(), p)
		var se *stripe.Error
		switch {
		case errors.As(err, &se):
			return "error " + string(se.Code)
		case err != nil:
			return "error " + err.Error()
		}
		return "charge " + ch.ID
	}
}

// retryable is hashicorp/go-retryablehttp with its default policy
// (retries connection errors, 429 and 5xx; honours Retry-After on 429 and
// 503) and short waits.
func retryable(url string) call { return retryableWith(url, nil, 4) }

// retryableWith is retryable setting header on the request (go-retryablehttp
// clones it onto every retry) and retrying up to max times.
func retryableWith(url string, header http.Header, max int) call {
	return func(key string, amount int64, timeout time.Duration) string {
		c := retryablehttp.NewClient()
		c.Logger = nil
		c.RetryWaitMin, c.RetryWaitMax, c.RetryMax = 100*time.Millisecond, 300*time.Millisecond, max
		c.HTTPClient.Timeout = timeout
		req, _ := retryablehttp.NewRequest(http.MethodPost, url+"/v1/charges", []byte(fmt.Sprintf(`{"amount":%d}`, amount)))
		for name, vs := range header {
			req.Header[name] = vs
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Forwarded-User", "merchant-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return "error " + errorWords(err)
		}
		defer resp.Body.Close()
		var body struct{ ID, Type string }
		json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode == http.StatusOK {
			return "charge " + body.ID
		}
		return fmt.Sprintf("response %d %s", resp.StatusCode, body.Type[strings.LastIndexAny(body.Type, "/:")+1:])
	}
}

// errorWords keeps what a retrying library says when it gives up, without
// the URL and attempt count.
func errorWords(err error) string {
	if strings.Contains(err.Error(), "giving up after") {
		return "giving up"
	}
	return err.Error()
}

// external runs a driver in another language (argv, then the sidecar's
// URL) and reads its JSON lines.
func external(t *testing.T, url string, argv ...string) calls {
	t.Helper()
	cmd := exec.Command(argv[0], append(argv[1:], url)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, stderr.String())
	}
	got := calls{}
	for line := range strings.Lines(string(out)) {
		var r struct {
			Scenario string
			Calls    []string
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%s printed %q: %v", argv[0], line, err)
		}
		got[r.Scenario] = r.Calls
	}
	return got
}

// need skips when a client's runtime is not installed, or fails when
// IDEMPROXY_REQUIRE_CLIENTS=1 (.ci/run sets it after installing them).
func need(t *testing.T, what, missing string) {
	t.Helper()
	if os.Getenv("IDEMPROXY_REQUIRE_CLIENTS") == "1" {
		t.Fatalf("%s is required (IDEMPROXY_REQUIRE_CLIENTS=1): %s", what, missing)
	}
	t.Skipf("SKIP: %s is not installed (%s); .ci/run installs it", what, missing)
}

// stripeBoth serves stripe-go and stripe-node on one route: a concurrent
// retry waits for the first attempt (each library retries a different
// in-progress status), and one that waited too long gets the 429
// lock_timeout stripe-go retries.
const stripeBoth = "  concurrent: wait\n  max_wait: 5s\n  in_progress_status: 429\n  problem_body: '" + stripeBody + "'\n"

// stripeWant is what both Stripe clients hand the application with the
// README's settings; they differ only on the upstream's 503 (busy).
func stripeWant(busy ...string) calls {
	return calls{
		"plain": {"charge"}, "replay": {"charge"},
		"reused":    {"error key-reused"},
		"malformed": {"error key-malformed"},
		// stripe-node retries the 502 (each retry a replay of it),
		// stripe-go does not; both raise it.
		"reset":      {"error outcome-unknown"},
		"busy":       busy,
		"concurrent": {"charge", "charge"},
		"timeout":    {"charge"},
	}
}

// TestStripeGo: stripe-go v82 with errors in Stripe's shape and the
// in-progress answer a 429 lock_timeout (the only API error stripe-go
// retries), or a route that waits.
func TestStripeGo(t *testing.T) {
	// stripe-go does not retry a 503 with a body in Stripe's shape: the
	// application's own retry executes, once (the 503 released the key).
	want := stripeWant("error upstream_busy", "charge")
	t.Run("429", func(t *testing.T) {
		l := newLedger()
		url := sidecar(t, l, "  in_progress_status: 429\n  problem_body: '"+stripeBody+"'\n")
		check(t, l, scenarios(stripeGo(url)), want)
	})
	t.Run("wait", func(t *testing.T) {
		l := newLedger()
		check(t, l, scenarios(stripeGo(sidecar(t, l, stripeBoth))), want)
	})
}

// TestStripeNode: stripe-node 23 (compat/node) with errors in Stripe's
// shape and the default in-progress 409, which stripe-node retries (it
// retries 409 and 5xx, not a 429), or a route that waits.
func TestStripeNode(t *testing.T) {
	needNode(t)
	want := stripeWant("charge") // it retries the 503 itself
	t.Run("409", func(t *testing.T) {
		l := newLedger()
		check(t, l, external(t, sidecar(t, l, "  problem_body: '"+stripeBody+"'\n"), "node", "node/stripe.mjs"), want)
	})
	t.Run("wait", func(t *testing.T) {
		l := newLedger()
		check(t, l, external(t, sidecar(t, l, stripeBoth), "node", "node/stripe.mjs"), want)
	})
}

// TestStripeNodeWithoutProblemBody is the finding, kept measured:
// with the default problem+json, stripe-node hands idemproxy's errors to
// the application as results (no error member, so no exception).
func TestStripeNodeWithoutProblemBody(t *testing.T) {
	needNode(t)
	l := newLedger()
	got := external(t, sidecar(t, l, ""), "node", "node/stripe.mjs")
	for _, scenario := range []string{"reused", "malformed", "reset"} {
		if c := got[scenario]; len(c) != 1 || !strings.HasPrefix(c[0], "result without id") {
			t.Errorf("%s with problem+json: stripe-node handed %q, want a result without id (no exception)", scenario, c)
		}
	}
}

// needNode skips or fails (need) unless node and stripe-node are installed.
func needNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		need(t, "node", err.Error())
	}
	if _, err := os.Stat("node/node_modules/stripe/package.json"); err != nil {
		need(t, "stripe-node", "run: cd compat/node && npm ci")
	}
}

// python finds an interpreter that has requests.
func python(t *testing.T) string {
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import requests").Run() == nil {
			return p
		}
	}
	need(t, "Python requests", "apt-get install python3-requests")
	return ""
}

// TestPythonRequests: requests with urllib3's Retry set for an idempotent
// API (POST allowed, 409/429/503 retried, Retry-After honoured) and the
// default settings: problem+json, in-progress 409.
func TestPythonRequests(t *testing.T) {
	py := python(t)
	l := newLedger()
	check(t, l, external(t, sidecar(t, l, ""), py, "python/requests_client.py"), calls{
		"plain": {"charge"}, "replay": {"charge"},
		"reused":     {"error key-reused"},
		"malformed":  {"error key-malformed"},
		"reset":      {"error outcome-unknown"},
		"busy":       {"charge"},
		"concurrent": {"charge", "charge"},
		"timeout":    {"charge"},
	})
}

// TestRetryableHTTP: hashicorp/go-retryablehttp (default policy: retries
// 429 and 5xx, not 409) with in_progress_status 503.
func TestRetryableHTTP(t *testing.T) {
	l := newLedger()
	url := sidecar(t, l, "  in_progress_status: 503\n")
	check(t, l, scenarios(retryable(url)), calls{
		"plain": {"charge"}, "replay": {"charge"},
		// It raises on nothing but exhausted retries: the application
		// reads the status.
		"reused":    {"response 422 key-reused"},
		"malformed": {"response 400 key-malformed"},
		// It retries the 502 (every retry a replay) and then gives up.
		"reset":      {"error giving up"},
		"busy":       {"charge"},
		"concurrent": {"charge", "charge"},
		"timeout":    {"charge"},
	})
}

// TestRetryableHTTPFirstSent (issue 33): go-retryablehttp clones a
// request's headers onto every retry, so an application that sets
// Repeatability-First-Sent once, before the first attempt, sends the same
// value on every retry. Through the real binary on a real redis-server:
// the charge executes; Redis restarts without its data; the application's
// retry of the same call (same key, same first-sent time) gets 412
// record-lost instead of a second charge, and a new call executes.
func TestRetryableHTTPFirstSent(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("IDEMPROXY_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server is required (IDEMPROXY_REQUIRE_REDIS=1)")
		}
		t.Skip("SKIP: redis-server is not installed")
	}
	port := freePort(t)
	var redis *exec.Cmd
	startRedis := func() {
		redis = exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		if err := redis.Start(); err != nil {
			t.Fatal(err)
		}
		for range 200 {
			if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				c.Close()
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
		t.Fatal("redis-server did not come up")
	}
	startRedis()
	t.Cleanup(func() { redis.Process.Kill(); redis.Wait() }) // by the PID this test started
	l := newLedger()
	url := sidecar(t, l, fmt.Sprintf("  in_progress_status: 503\nstore:\n  redis:\n    addrs: [\"127.0.0.1:%d\"]\n", port))

	first := time.Now().UTC().Format(http.TimeFormat) // read once, before the first attempt
	charge := func(key string, sent string) string {
		got := retryableWith(url, http.Header{"Repeatability-First-Sent": {sent}}, 10)(key, 700, 0)
		if strings.HasPrefix(got, "charge ") {
			return "charge"
		}
		return got
	}
	if got := charge("order-77", first); got != "charge" {
		t.Fatalf("the first call: %s", got)
	}
	// The sidecar's store watcher has read the epoch, and the loss comes
	// well after the first-sent time (which HTTP dates truncate to the
	// second) plus the 2 s first_sent_skew.
	time.Sleep(3500 * time.Millisecond)
	redis.Process.Kill() // Redis restarts without its data
	redis.Wait()
	startRedis()
	// The library retries the 503s while the sidecar reconnects, then
	// hands the application the 412.
	if got := charge("order-77", first); got != "response 412 record-lost" {
		t.Errorf("the application's retry after Redis lost its data: %s, want response 412 record-lost", got)
	}
	if n := l.executions()["order-77"]; n != 1 {
		t.Errorf("order-77 executed %d times, want 1", n)
	}
	if got := charge("order-78", time.Now().UTC().Format(http.TimeFormat)); got != "charge" {
		t.Errorf("a new call after the loss: %s, want a charge", got)
	}
}

// TestStripeWebhook (issue 34): deliveries signed by stripe-go's own
// helper (webhook.GenerateTestSignedPayload), through the real binary: the
// event executes the legacy handler once, Stripe's redelivery (signed
// anew, later) gets the first answer replayed, a delivery signed with
// another secret or an old timestamp is 401 and never reaches the handler.
func TestStripeWebhook(t *testing.T) {
	l := newLedger()
	secret := "whsec_" + strings.Repeat("c0ffee", 6)
	path := filepath.Join(t.TempDir(), "whsec")
	if err := os.WriteFile(path, []byte(secret), 0o400); err != nil {
		t.Fatal(err)
	}
	url := sidecarRoutes(t, l, "", fmt.Sprintf("  - name: stripe-events\n    match: \"POST /v1/charges\"\n    webhook:\n      provider: stripe\n      secret_files: [%q]\n", path))
	deliver := func(payload []byte, signed *webhook.SignedPayload) (int, string) {
		return postDelivery(t, url+"/v1/charges", payload, http.Header{"Stripe-Signature": {signed.Header}})
	}
	event := []byte(`{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":2000}}}`)
	sign := func(secret string, at time.Time) *webhook.SignedPayload {
		return webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: event, Secret: secret, Timestamp: at})
	}
	status, first := deliver(event, sign(secret, time.Now()))
	if status != http.StatusOK {
		t.Fatalf("the event: %d %s", status, first)
	}
	status, again := deliver(event, sign(secret, time.Now().Add(time.Minute)))
	if status != http.StatusOK || again != "true"+first { // first is " <body>": not replayed
		t.Errorf("Stripe's redelivery: %d %q, want the first answer replayed", status, again)
	}
	if status, b := deliver(event, sign("whsec_"+strings.Repeat("bad", 8), time.Now())); status != http.StatusUnauthorized || !strings.Contains(b, "signature-invalid") {
		t.Errorf("signed with another secret: %d %s, want 401", status, b)
	}
	if status, b := deliver(event, sign(secret, time.Now().Add(-time.Hour))); status != http.StatusUnauthorized {
		t.Errorf("signed an hour ago: %d %s, want 401 (outside the tolerance)", status, b)
	}
	if n := l.executions()["evt_1NG8Du2eZvKYlo2CUI79vXWy"]; n != 1 {
		t.Errorf("the event executed %d times, want 1", n)
	}
}

// TestStandardWebhooksSigners (issue 41): deliveries signed by Svix's own
// Go library (it sends svix-id, svix-timestamp, svix-signature) and by
// the Standard Webhooks reference library (webhook-*) through a
// `provider: standard` route: each executes once, its redelivery (signed
// anew) is replayed, and one signed with another secret is 401.
func TestStandardWebhooksSigners(t *testing.T) {
	l := newLedger()
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	path := filepath.Join(t.TempDir(), "whsec")
	if err := os.WriteFile(path, []byte(secret), 0o400); err != nil {
		t.Fatal(err)
	}
	url := sidecarRoutes(t, l, "", fmt.Sprintf("  - name: events\n    match: \"POST /v1/charges\"\n    webhook:\n      provider: standard\n      secret_files: [%q]\n", path))
	svixSigner, err := svix.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	stdSigner, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := svix.NewWebhook("whsec_" + base64.StdEncoding.EncodeToString([]byte("another-secret-0123456789")))
	for _, tc := range []struct {
		name   string
		prefix string // of the header names
		sign   func(id string, at time.Time, body []byte) (string, error)
	}{
		{"svix", "Svix-", svixSigner.Sign},
		{"standard-webhooks", "Webhook-", stdSigner.Sign},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "msg_" + tc.name
			body := []byte(fmt.Sprintf(`{"type":"invoice.paid","data":{"id":%q}}`, id))
			deliver := func(sign func(string, time.Time, []byte) (string, error), at time.Time) (int, string) {
				t.Helper()
				sig, err := sign(id, at, body)
				if err != nil {
					t.Fatal(err)
				}
				h := http.Header{}
				h.Set(tc.prefix+"Id", id)
				h.Set(tc.prefix+"Timestamp", strconv.FormatInt(at.Unix(), 10))
				h.Set(tc.prefix+"Signature", sig)
				return postDelivery(t, url+"/v1/charges", body, h)
			}
			status, first := deliver(tc.sign, time.Now())
			if status != http.StatusOK {
				t.Fatalf("the delivery: %d %s", status, first)
			}
			status, again := deliver(tc.sign, time.Now().Add(30*time.Second))
			if status != http.StatusOK || again != "true"+first {
				t.Errorf("the redelivery: %d %q, want the first answer replayed", status, again)
			}
			if status, b := deliver(other.Sign, time.Now()); status != http.StatusUnauthorized || !strings.Contains(b, "signature-invalid") {
				t.Errorf("signed with another secret: %d %s, want 401", status, b)
			}
			if n := l.executions()[id]; n != 1 {
				t.Errorf("executed %d times, want 1", n)
			}
		})
	}
}

// postDelivery posts a JSON webhook delivery of payload to url with the
// signature headers in h; it answers the status and the Idempotent-Replayed
// header, a space and the body.
func postDelivery(t *testing.T, url string, payload []byte, h http.Header) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
	for k, vs := range h {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") + " " + string(b)
}

// chatUpstream is a small OpenAI-compatible upstream: POST
// /v1/chat/completions with stream: true answers server-sent events, one
// chunk per word of its answer, then [DONE]. A prompt "slow" holds its
// headers 1.2 s (longer than the client's timeout); "long" holds its
// chunks after the first until the application, having got that first
// one, asks GET /release (5 s at most: the answer then says
// "unreleased"), so that the stream is live when a second call attaches.
// It counts executions per prompt.
type chatUpstream struct {
	mu      sync.Mutex
	execs   map[string]int
	release chan struct{} // closed by GET /release
	once    sync.Once
}

func (c *chatUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/release" {
		c.once.Do(func() { close(c.release) })
		return
	}
	var req struct {
		Stream   bool `json:"stream"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream || len(req.Messages) == 0 {
		http.Error(w, "want a streamed chat completion", http.StatusBadRequest)
		return
	}
	prompt := req.Messages[0].Content
	c.mu.Lock()
	c.execs[prompt]++
	n := c.execs[prompt]
	c.mu.Unlock()
	pause := 10 * time.Millisecond
	switch prompt {
	case "slow":
		time.Sleep(1200 * time.Millisecond)
	case "long":
		pause = 150 * time.Millisecond
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for i, word := range strings.Fields(fmt.Sprintf("answer to %s, execution %d", prompt, n)) {
		if prompt == "long" && i == 1 {
			select {
			case <-c.release:
			case <-time.After(5 * time.Second):
				word = "unreleased"
			}
		}
		chunk, _ := json.Marshal(map[string]any{
			"id": "chatcmpl-compat", "object": "chat.completion.chunk", "created": 1, "model": "compat",
			"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": word + " "}, "finish_reason": nil}},
		})
		fmt.Fprintf(w, "data: %s\n\n", chunk)
		http.NewResponseController(w).Flush()
		time.Sleep(pause)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestOpenAINodeStream (issue 44): the openai npm package streams chat
// completions through the real binary (record_format 4, stream: auto) with
// its own retries: its generated Idempotency-Key is kept across the
// retries of a call that timed out before the stream began, and the retry
// gets the one execution's stream; an explicit key replays the same text;
// a second call during a stream attaches and gets the same text.
func TestOpenAINodeStream(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		need(t, "node", err.Error())
	}
	if _, err := os.Stat("node/node_modules/openai/package.json"); err != nil {
		need(t, "the openai npm package", "run: cd compat/node && npm ci")
	}
	up := &chatUpstream{execs: map[string]int{}, release: make(chan struct{})}
	url := sidecarFor(t, up, "store:\n  record_format: 4\n", "  - name: chat\n    match: \"POST /v1/chat/completions\"\n")
	got := external(t, url, "node", "node/openai_stream.mjs")
	want := calls{
		"stream":   {"text answer to plain, execution 1  replayed=false"},
		"replay":   {"text answer to plain, execution 1  replayed=true"},
		"retried":  {"text answer to slow, execution 1  replayed=true"},
		"attached": {"text answer to long, execution 1  replayed=false", "text answer to long, execution 1  replayed=true"},
	}
	for scenario, w := range want {
		if g := got[scenario]; strings.Join(g, "|") != strings.Join(w, "|") {
			t.Errorf("%s: the application streamed %q, want %q", scenario, g, w)
		}
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for prompt, n := range up.execs {
		if n != 1 {
			t.Errorf("prompt %q executed %d times at the upstream, want 1", prompt, n)
		}
	}
}

// eventsUpstream answers POST /v1/events with one generation of eight
// server-sent events, each with an id ("id: 3", "data: event 3 of
// execution 1"), 20 ms apart, counting executions.
type eventsUpstream struct {
	mu    sync.Mutex
	execs int
}

func (e *eventsUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.execs++
	n := e.execs
	e.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(w, "id: %d\ndata: event %d of execution %d\n\n", i, i, n)
		http.NewResponseController(w).Flush()
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFetchEventSourceResumes (issue 55): @microsoft/fetch-event-source,
// a client nobody here wrote, resends Last-Event-ID on its own retries.
// Its first connection is cut after the third event; its retry (the same
// POST, body and Idempotency-Key) gets the events after the third, with
// Idempotent-Resumed-After: 3: the application sees each of the eight
// events once, and the upstream generated once. A later call with the key
// and no Last-Event-ID gets the whole stream.
func TestFetchEventSourceResumes(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		need(t, "node", err.Error())
	}
	if _, err := os.Stat("node/node_modules/@microsoft/fetch-event-source/package.json"); err != nil {
		need(t, "the @microsoft/fetch-event-source npm package", "run: cd compat/node && npm ci")
	}
	up := &eventsUpstream{}
	url := sidecarFor(t, up, "store:\n  record_format: 4\n", "  - name: events\n    match: \"POST /v1/events\"\n")
	got := external(t, url, "node", "node/resume_events.mjs")
	var all []string
	for i := 1; i <= 8; i++ {
		all = append(all, fmt.Sprintf("%d:event %d of execution 1", i, i))
	}
	want := calls{
		"cut":   {strings.Join(all, " "), "resumed -,3"},
		"whole": {strings.Join(all, " "), "resumed -"},
	}
	for scenario, w := range want {
		if g := got[scenario]; strings.Join(g, "|") != strings.Join(w, "|") {
			t.Errorf("%s: the application got %q, want %q", scenario, g, w)
		}
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.execs != 1 {
		t.Errorf("the upstream generated %d times, want 1", up.execs)
	}
}

// messagesUpstream is a small Anthropic Messages-compatible upstream: POST
// /v1/messages with stream: true answers the Messages API's server-sent
// events (message_start, a text block's deltas, one per word, its stop,
// message_delta, message_stop). A prompt "slow" holds its headers 1.2 s
// (longer than the client's timeout). It counts executions per prompt.
type messagesUpstream struct {
	mu    sync.Mutex
	execs map[string]int
}

func (m *messagesUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream   bool `json:"stream"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream || len(req.Messages) == 0 {
		http.Error(w, "want a streamed message", http.StatusBadRequest)
		return
	}
	prompt := req.Messages[0].Content
	m.mu.Lock()
	m.execs[prompt]++
	n := m.execs[prompt]
	m.mu.Unlock()
	if prompt == "slow" {
		time.Sleep(1200 * time.Millisecond)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(event string, data map[string]any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
		http.NewResponseController(w).Flush()
		time.Sleep(10 * time.Millisecond)
	}
	send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_compat", "type": "message", "role": "assistant", "content": []any{}, "model": "compat",
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": 1, "output_tokens": 0},
	}})
	send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]string{"type": "text", "text": ""}})
	words := strings.Fields(fmt.Sprintf("answer to %s, execution %d", prompt, n))
	for _, word := range words {
		send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": word + " "}})
	}
	send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	send("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]int{"output_tokens": len(words)}})
	send("message_stop", map[string]any{"type": "message_stop"})
}

// TestAnthropicNodeStream (issue 55): the @anthropic-ai/sdk package
// streams messages through the real binary (record_format 4, stream:
// auto) with its own retries: a call that timed out before the stream
// began is retried under the application's key and gets the one
// execution's stream; the key again replays the same text.
func TestAnthropicNodeStream(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		need(t, "node", err.Error())
	}
	if _, err := os.Stat("node/node_modules/@anthropic-ai/sdk/package.json"); err != nil {
		need(t, "the @anthropic-ai/sdk npm package", "run: cd compat/node && npm ci")
	}
	up := &messagesUpstream{execs: map[string]int{}}
	url := sidecarFor(t, up, "store:\n  record_format: 4\n", "  - name: messages\n    match: \"POST /v1/messages\"\n")
	got := external(t, url, "node", "node/anthropic_stream.mjs")
	want := calls{
		"stream":  {"text answer to plain, execution 1  replayed=false"},
		"replay":  {"text answer to plain, execution 1  replayed=true"},
		"retried": {"text answer to slow, execution 1  replayed=true"},
	}
	for scenario, w := range want {
		if g := got[scenario]; strings.Join(g, "|") != strings.Join(w, "|") {
			t.Errorf("%s: the application streamed %q, want %q", scenario, g, w)
		}
	}
	m := up
	m.mu.Lock()
	defer m.mu.Unlock()
	for prompt, n := range m.execs {
		if n != 1 {
			t.Errorf("prompt %q executed %d times at the upstream, want 1", prompt, n)
		}
	}
}
