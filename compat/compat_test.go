package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	retryablehttp "github.com/hashicorp/go-retryablehttp"
	stripe "github.com/stripe/stripe-go/v82"
)

// stripeBody is the problem_body the README recommends for clients that
// read errors in Stripe's shape.
// stripe-go raises on any error in that shape, and retries an API error
// only when it is a 429 lock_timeout: so the in-progress answer is a 429
// (in_progress_status) with that code, and a concurrent retry waits for
// the first attempt instead of failing.
const stripeBody = `{"error":{"type":"idempotency_error","code":{{if eq .Code "request-in-progress"}}"lock_timeout"{{else}}{{json .Code}}{{end}},"message":{{json .Detail}},"request_id":{{json .RequestID}}}}`

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary builds idemproxy from the repository once.
func binary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemproxy-compat-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "idemproxy")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
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
// counted per idempotency key; mode says how the next request fails.
type ledger struct {
	mu    sync.Mutex
	execs map[string]int
	n     int
	// resetNext drops the connection after acting, once; busyNext answers
	// 503 without acting, once; slow delays every answer.
	resetNext, busyNext atomic.Bool
	slow                atomic.Int64
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	if l.busyNext.CompareAndSwap(true, false) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"type":"api_error","message":"busy"}}`)
		return
	}
	l.mu.Lock()
	l.execs[r.Header.Get("Idempotency-Key")]++
	l.n++
	id := fmt.Sprintf("ch_%d", l.n)
	l.mu.Unlock()
	time.Sleep(time.Duration(l.slow.Load()))
	if l.resetNext.CompareAndSwap(true, false) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q,"object":"charge","amount":100,"currency":"usd"}`, id)
}

func (l *ledger) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// sidecar runs the binary in front of l with route settings extra.
func sidecar(t *testing.T, l *ledger, extra string) string {
	t.Helper()
	up := httptest.NewServer(l)
	t.Cleanup(up.Close)
	port, admin := freePort(t), freePort(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf(`listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
upstream:
  url: %q
defaults:
  lease: 2s
%sroutes:
  - name: charges
    match: "POST /v1/charges"
`, port, admin, up.URL, extra)), 0o600)
	cmd := exec.Command(binary(t), "-config", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) // by the PID this test started
	for range 200 {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", admin)); err == nil {
			resp.Body.Close()
			return fmt.Sprintf("http://127.0.0.1:%d", port)
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("idemproxy did not come up:\n%s", stderr.String())
	return ""
}

// stripeClient is stripe-go pointed at url, with its default retries.
func stripeClient(url string) *stripe.Client {
	return stripe.NewClient("sk_test_compat", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(url),
		MaxNetworkRetries: stripe.Int64(3),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
}

func charge(ctx context.Context, c *stripe.Client, key string, amount int64) (*stripe.Charge, error) {
	p := &stripe.ChargeCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd")}
	p.SetIdempotencyKey(key)
	p.Headers = http.Header{"X-Forwarded-User": {"merchant-1"}}
	return c.V1Charges.Create(ctx, p)
}

// TestStripeGo: stripe-go v82 through idemproxy with the README's
// settings (problem_body in Stripe's error shape).
func TestStripeGo(t *testing.T) {
	l := &ledger{execs: map[string]int{}}
	url := sidecar(t, l, "  in_progress_status: 429\n  problem_body: '"+stripeBody+"'\n")
	c := stripeClient(url)
	ctx := context.Background()

	first, err := charge(ctx, c, "plain", 100)
	if err != nil || first.ID == "" {
		t.Fatalf("plain call: %+v %v", first, err)
	}
	again, err := charge(ctx, c, "plain", 100)
	if err != nil || again.ID != first.ID {
		t.Fatalf("replay: %+v %v, want %s", again, err, first.ID)
	}
	if _, err := charge(ctx, c, "plain", 999); err == nil || !strings.Contains(err.Error(), "key-reused") {
		t.Errorf("a reused key with another body: %v, want an error naming key-reused", err)
	}

	l.resetNext.Store(true)
	before := l.total()
	_, err = charge(ctx, c, "reset", 100)
	var se *stripe.Error
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "outcome-unknown") {
		t.Errorf("upstream reset after acting: %v, want a stripe.Error naming outcome-unknown", err)
	}
	if n := l.total() - before; n != 1 {
		t.Errorf("upstream reset after acting: executed %d times, want 1", n)
	}

	// stripe-go does not retry a 503 (only a 429 lock_timeout): the
	// application sees the error, and its own retry executes, once, since
	// the upstream's 503 released the key.
	l.busyNext.Store(true)
	before = l.total()
	if _, err := charge(ctx, c, "busy", 100); err == nil {
		t.Errorf("503: no error, want the upstream's 503 surfaced")
	}
	if ch, err := charge(ctx, c, "busy", 100); err != nil || ch.ID == "" {
		t.Errorf("the application's retry after a 503: %+v %v, want the charge", ch, err)
	}
	if n := l.total() - before; n != 1 {
		t.Errorf("503 then 200: executed %d times, want 1", n)
	}

	// Two concurrent charges with one key: the second gets the 429
	// lock_timeout while the first runs, retries, and gets the same charge.
	l.slow.Store(int64(300 * time.Millisecond))
	var wg sync.WaitGroup
	got := make([]string, 2)
	for i := range got {
		wg.Go(func() {
			ch, err := charge(ctx, c, "concurrent", 100)
			if err != nil {
				t.Errorf("concurrent charge %d: %v", i, err)
				return
			}
			got[i] = ch.ID
		})
	}
	wg.Wait()
	l.slow.Store(0)
	if got[0] == "" || got[0] != got[1] {
		t.Errorf("concurrent charges got %q and %q, want one charge", got[0], got[1])
	}
	for _, k := range []string{"plain", "reset", "busy", "concurrent"} {
		if n := l.execs[k]; n != 1 {
			t.Errorf("key %s executed %d times, want 1", k, n)
		}
	}
}

// TestRetryableHTTP: hashicorp/go-retryablehttp (default policy: retries
// 429 and 5xx, not 409) with in_progress_status 503: two concurrent calls
// with one key both get the charge, executed once.
func TestRetryableHTTP(t *testing.T) {
	l := &ledger{execs: map[string]int{}}
	l.slow.Store(int64(400 * time.Millisecond))
	url := sidecar(t, l, "  in_progress_status: 503\n")
	c := retryablehttp.NewClient()
	c.Logger = nil
	c.RetryWaitMin, c.RetryWaitMax, c.RetryMax = 100*time.Millisecond, 300*time.Millisecond, 10
	call := func() (int, string, error) {
		req, _ := retryablehttp.NewRequest(http.MethodPost, url+"/v1/charges", []byte(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "concurrent")
		req.Header.Set("X-Forwarded-User", "merchant-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ch struct{ ID string }
		json.Unmarshal(b, &ch)
		return resp.StatusCode, ch.ID, nil
	}
	var wg sync.WaitGroup
	ids := make([]string, 2)
	for i := range ids {
		wg.Go(func() {
			status, id, err := call()
			if err != nil || status != http.StatusOK {
				t.Errorf("call %d: %d %v, want the charge", i, status, err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	if ids[0] == "" || ids[0] != ids[1] {
		t.Errorf("concurrent calls got %q and %q, want one charge", ids[0], ids[1])
	}
	if n := l.total(); n != 1 {
		t.Errorf("upstream executed %d times, want 1", n)
	}
}
