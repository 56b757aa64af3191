package e2e

import (
	"fmt"
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

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// ledger is an upstream that keeps, per key, the effect it committed (the
// charge) and answers the reconcile lookup from it, as the README asks an
// upstream to: one indexed read of what the effect's own transaction
// wrote. How each key's first POST behaves is set per test.
type ledger struct {
	mu      sync.Mutex
	charges map[string]string // key -> the answer's body
	calls   map[string]int    // key -> POSTs that reached the handler
	// first says how the first POST of a key behaves: "" answers 201;
	// "act-reset" commits and resets the connection without answering;
	// "reset" resets without committing; "hang" commits and never
	// answers; "late" commits after lateAct and then answers.
	first   map[string]string
	lateAct time.Duration
	// lookupDown makes the lookup answer 503 (without the key).
	lookupDown atomic.Bool
	lookups    atomic.Int64
	stop       chan struct{}
}

func newLedger(t *testing.T) (*ledger, *httptest.Server) {
	l := &ledger{charges: map[string]string{}, calls: map[string]int{}, first: map[string]string{}, stop: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", l.pay)
	mux.HandleFunc("GET /payments/by-key/{key}", l.lookup)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { close(l.stop); srv.CloseClientConnections(); srv.Close() })
	return l, srv
}

func (l *ledger) pay(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	l.mu.Lock()
	l.calls[key]++
	n := l.calls[key]
	mode := l.first[key]
	if n > 1 {
		mode = ""
	}
	commit := func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		body := fmt.Sprintf(`{"id":"ch_%s_%d"}`, key, n)
		l.charges[key] = body
		return body
	}
	l.mu.Unlock()
	reset := func() {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	switch mode {
	case "act-reset":
		commit()
		reset()
	case "reset":
		reset()
	case "hang":
		commit()
		<-l.stop
	case "late":
		select {
		case <-time.After(l.lateAct):
		case <-l.stop:
			return
		}
		body := commit()
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(body))
	default:
		body := commit()
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(body))
	}
}

func (l *ledger) lookup(w http.ResponseWriter, r *http.Request) {
	l.lookups.Add(1)
	key := r.PathValue("key")
	if l.lookupDown.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if r.Header.Get("Idempotency-Key") != key || r.Header.Get("X-Forwarded-User") != "alice" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	body, ok := l.charges[key]
	l.mu.Unlock()
	w.Header().Set("Idempotency-Key", key)
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(body))
}

func (l *ledger) executions(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[key]
}

// reconcileConfig is a route that reconciles: upstream.timeout 1s, no late
// window, absent_after 2s, lease 1s (an absent answer is believed once the
// first attempt is absent_after plus a lease old), lookups of 500ms.
func reconcileConfig(upstream, store string) string {
	return fmt.Sprintf(`upstream:
  url: %q
  timeout: 1s
  late_answer_window: 0s
store:
%sdefaults:
  lease: 1s
routes:
  - name: pay
    match: "POST /payments"
    reconcile:
      url: "/payments/by-key/{key}"
      status: 201
      timeout: 500ms
      absent_after: 2s
`, upstream, store)
}

// TestReconcileThroughTheBinary (issue 43): where the outcome would be
// unknown, the route asks the upstream, and no answer it gives, early,
// missing or found, executes a request twice. Without reconcile (v0.5.0,
// or this binary with the block removed) each first case answers 502
// outcome-unknown for the whole retention.
func TestReconcileThroughTheBinary(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		reconcileThroughTheBinary(t, fmt.Sprintf("  redis:\n    addrs: [%q]\n", redistest.Start(t).Addr))
	})
	t.Run("postgres", func(t *testing.T) {
		reconcileThroughTheBinary(t, fmt.Sprintf("  postgres:\n    url: %q\n", pgtest.Start(t).URL))
	})
}

// reconcileThroughTheBinary is TestReconcileThroughTheBinary on the store
// its section configures.
func reconcileThroughTheBinary(t *testing.T, store string) {
	l, upstream := newLedger(t)
	cfg := reconcileConfig(upstream.URL, store)

	t.Run("the upstream acted, then the connection reset: the first client gets the real answer", func(t *testing.T) {
		a := startBinary(t, cfg)
		l.mu.Lock()
		l.first["acted-1"] = "act-reset"
		l.mu.Unlock()
		resp, body := postAnswer(t, a.Client+"/payments", "acted-1", `{"amount":1}`)
		if resp.StatusCode != http.StatusCreated || body != `{"id":"ch_acted-1_1"}` || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Fatalf("first attempt: %d %s %v, want 201 with the upstream's record, reconciled", resp.StatusCode, body, resp.Header)
		}
		resp, again := postAnswer(t, a.Client+"/payments", "acted-1", `{"amount":1}`)
		if resp.StatusCode != http.StatusCreated || again != body || resp.Header.Get("Idempotent-Replayed") != "true" || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Errorf("retry: %d %s %v, want the same 201 replayed", resp.StatusCode, again, resp.Header)
		}
		if n := l.executions("acted-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1", n)
		}
		if !metric(t, a.Admin, `idemproxy_reconciled_total{result="found",route="pay"} 1`) {
			t.Errorf("found not counted:\n%s", grepLines(scrape(t, a.Admin), "idemproxy_reconciled_total"))
		}
	})

	t.Run("the upstream never acted, then the connection reset: after absent_after a retry executes once", func(t *testing.T) {
		a := startBinary(t, cfg)
		l.mu.Lock()
		l.first["never-1"] = "reset"
		l.mu.Unlock()
		start := time.Now()
		resp, body := postAnswer(t, a.Client+"/payments", "never-1", `{"amount":1}`)
		if resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("first attempt: %d %s, want 409 with Retry-After (absent, but too early to believe)", resp.StatusCode, body)
		}
		var status int
		poll.Until(t, "a retry executes", func() bool {
			status, body = post(t, a.Client+"/payments", "never-1", `{"amount":1}`)
			if status != http.StatusCreated && status != http.StatusConflict {
				// A 502 here tells the client the outcome is unknown while
				// every lookup answered: a retry spaced out of asking must
				// hear "in progress", not the stored 502.
				t.Fatalf("retry: %d %s, want 409 until it executes", status, body)
			}
			return status == http.StatusCreated
		})
		if elapsed := time.Since(start); elapsed < 2*time.Second {
			t.Errorf("the retry executed %s after the first attempt, before absent_after (2s)", elapsed)
		}
		if body != `{"id":"ch_never-1_2"}` {
			t.Errorf("retry answered %s, want the second call's own answer", body)
		}
		if n := l.executions("never-1"); n != 2 {
			t.Errorf("upstream reached %d times, want 2 (the reset call that did nothing, the retry)", n)
		}
		if again, b := post(t, a.Client+"/payments", "never-1", `{"amount":1}`); again != http.StatusCreated || b != body {
			t.Errorf("next retry: %d %s, want the replay", again, b)
		}
	})

	t.Run("the owner killed after the upstream acted: a retry through another sidecar gets the record", func(t *testing.T) {
		a, b := startBinary(t, cfg), startBinary(t, cfg)
		l.mu.Lock()
		l.first["killed-1"] = "hang"
		l.mu.Unlock()
		go func() { // its sidecar is killed: no answer comes
			if resp, err := http.DefaultClient.Do(payRequest(a.Client+"/payments", "killed-1", `{"amount":1}`)); err == nil {
				resp.Body.Close()
			}
		}()
		poll.Until(t, "the upstream acted", func() bool {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.charges["killed-1"] != ""
		})
		a.Kill()
		var resp *http.Response
		var body string
		poll.Until(t, "the retry is answered", func() bool {
			resp, body = postAnswer(t, b.Client+"/payments", "killed-1", `{"amount":1}`)
			return resp.StatusCode != http.StatusConflict
		})
		if resp.StatusCode != http.StatusCreated || body != `{"id":"ch_killed-1_1"}` || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Fatalf("retry after the owner vanished: %d %s, want 201 with the upstream's record", resp.StatusCode, body)
		}
		if n := l.executions("killed-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1", n)
		}
	})

	t.Run("the owner killed while the upstream still works: an early absent is not believed", func(t *testing.T) {
		a, b := startBinary(t, cfg), startBinary(t, cfg)
		l.mu.Lock()
		l.first["working-1"] = "late"
		l.lateAct = 1800 * time.Millisecond // inside absent_after: the app's longest run
		l.mu.Unlock()
		go func() { // its sidecar is killed: no answer comes
			if resp, err := http.DefaultClient.Do(payRequest(a.Client+"/payments", "working-1", `{"amount":1}`)); err == nil {
				resp.Body.Close()
			}
		}()
		poll.Until(t, "the request reached the upstream", func() bool { return l.executions("working-1") == 1 })
		a.Kill()
		sawTooEarly := false
		var status int
		var body string
		poll.Until(t, "the retry gets the record", func() bool {
			resp, b := postAnswer(t, b.Client+"/payments", "working-1", `{"amount":1}`)
			status, body = resp.StatusCode, b
			if strings.Contains(b, "has no record of this key yet") {
				sawTooEarly = true
			}
			return status == http.StatusCreated
		})
		if body != `{"id":"ch_working-1_1"}` {
			t.Errorf("retry answered %s, want the first attempt's record", body)
		}
		if n := l.executions("working-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1 (an early absent was believed)", n)
		}
		if !sawTooEarly {
			t.Log("no retry asked while the upstream still worked (slow machine): the early-absent rule was not exercised this run")
		}
	})

	t.Run("the key API reconciles one key now", func(t *testing.T) {
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-admin\n"), 0o400); err != nil {
			t.Fatal(err)
		}
		a := startBinary(t, cfg+fmt.Sprintf("admin:\n  token_file: %q\n", tokenFile))
		l.mu.Lock()
		l.first["api-1"] = "act-reset"
		l.mu.Unlock()
		l.lookupDown.Store(true)
		status, body := post(t, a.Client+"/payments", "api-1", `{"amount":1}`)
		l.lookupDown.Store(false)
		if status != http.StatusBadGateway {
			t.Fatalf("first attempt with the lookup down: %d %s, want 502", status, body)
		}
		time.Sleep(600 * time.Millisecond) // lookups are spaced by the lookup timeout
		out, err := exec.Command(buildBinary(t), "keys", "reconcile", "-admin", a.Admin, "-token-file", tokenFile,
			"-route", "pay", "-principal", "alice", "-key", "api-1").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"result":"found"`) || !strings.Contains(string(out), `"status":201`) {
			t.Fatalf("idemproxy keys reconcile: %v\n%s", err, out)
		}
		resp, again := postAnswer(t, a.Client+"/payments", "api-1", `{"amount":1}`)
		if resp.StatusCode != http.StatusCreated || again != `{"id":"ch_api-1_1"}` || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Errorf("retry after reconcile-now: %d %s", resp.StatusCode, again)
		}
		if n := l.executions("api-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1", n)
		}
	})

	t.Run("the lookup down: outcome-unknown stays, and heals when the lookup is back", func(t *testing.T) {
		a := startBinary(t, cfg)
		l.mu.Lock()
		l.first["down-1"] = "act-reset"
		l.mu.Unlock()
		l.lookupDown.Store(true)
		defer l.lookupDown.Store(false)
		status, body := post(t, a.Client+"/payments", "down-1", `{"amount":1}`)
		if status != http.StatusBadGateway || !strings.Contains(body, "outcome-unknown") || !strings.Contains(body, "Retry with the same idempotency key") {
			t.Fatalf("first attempt with the lookup down: %d %s, want 502 outcome-unknown saying to retry with the same key", status, body)
		}
		time.Sleep(600 * time.Millisecond) // lookups are spaced by the lookup timeout
		if again, b := post(t, a.Client+"/payments", "down-1", `{"amount":1}`); again != http.StatusBadGateway || b != body {
			// The 502 is put back after each failed lookup: still the
			// first attempt's, byte for byte.
			t.Fatalf("retry with the lookup still down: %d %s, want the first 502 %s", again, b, body)
		}
		l.lookupDown.Store(false)
		var resp *http.Response
		poll.Until(t, "the retry heals", func() bool {
			resp, body = postAnswer(t, a.Client+"/payments", "down-1", `{"amount":1}`)
			return resp.StatusCode == http.StatusCreated
		})
		if body != `{"id":"ch_down-1_1"}` || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Errorf("healed retry: %s %v, want the upstream's record, reconciled", body, resp.Header)
		}
		if n := l.executions("down-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1", n)
		}
		if !metric(t, a.Admin, `idemproxy_reconciled_total{result="unresolved",route="pay"}`) {
			t.Error("unresolved lookups not counted")
		}
	})

	keep := strings.Replace(cfg, "defaults:\n", "defaults:\n  unknown_outcome: keep\n", 1)
	t.Run("keep: the upstream acted, then reset: the first client gets the real answer", func(t *testing.T) {
		a := startBinary(t, keep)
		l.mu.Lock()
		l.first["keep-acted-1"] = "act-reset"
		l.mu.Unlock()
		resp, body := postAnswer(t, a.Client+"/payments", "keep-acted-1", `{"amount":1}`)
		if resp.StatusCode != http.StatusCreated || body != `{"id":"ch_keep-acted-1_1"}` || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Fatalf("first attempt under keep: %d %s, want 201 with the upstream's record", resp.StatusCode, body)
		}
		time.Sleep(1500 * time.Millisecond) // past keep's extra lease: v0.5.0 would execute again now
		if status, again := post(t, a.Client+"/payments", "keep-acted-1", `{"amount":1}`); status != http.StatusCreated || again != body {
			t.Errorf("retry: %d %s, want the replay", status, again)
		}
		if n := l.executions("keep-acted-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1", n)
		}
	})

	t.Run("keep: the owner killed after acting: a retry asks before it executes again", func(t *testing.T) {
		a, b := startBinary(t, keep), startBinary(t, keep)
		l.mu.Lock()
		l.first["keep-killed-1"] = "hang"
		l.mu.Unlock()
		go func() { // its sidecar is killed: no answer comes
			if resp, err := http.DefaultClient.Do(payRequest(a.Client+"/payments", "keep-killed-1", `{"amount":1}`)); err == nil {
				resp.Body.Close()
			}
		}()
		poll.Until(t, "the upstream acted", func() bool {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.charges["keep-killed-1"] != ""
		})
		a.Kill()
		var resp *http.Response
		var body string
		poll.Until(t, "the retry is answered", func() bool {
			resp, body = postAnswer(t, b.Client+"/payments", "keep-killed-1", `{"amount":1}`)
			return resp.StatusCode != http.StatusConflict
		})
		if resp.StatusCode != http.StatusCreated || body != `{"id":"ch_keep-killed-1_1"}` || resp.Header.Get("Idempotent-Reconciled") != "true" {
			t.Fatalf("retry after the owner vanished under keep: %d %s, want 201 with the upstream's record", resp.StatusCode, body)
		}
		if n := l.executions("keep-killed-1"); n != 1 {
			t.Errorf("upstream executed %d times, want 1", n)
		}
	})

	t.Run("keep: never acted, then reset: a retry executes again as keep says", func(t *testing.T) {
		a := startBinary(t, keep)
		l.mu.Lock()
		l.first["keep-never-1"] = "reset"
		l.mu.Unlock()
		if status, body := post(t, a.Client+"/payments", "keep-never-1", `{"amount":1}`); status != http.StatusBadGateway {
			t.Fatalf("first attempt: %d %s, want 502 upstream-failed (keep)", status, body)
		}
		var status int
		var body string
		poll.Until(t, "a retry executes", func() bool {
			status, body = post(t, a.Client+"/payments", "keep-never-1", `{"amount":1}`)
			return status == http.StatusCreated
		})
		if body != `{"id":"ch_keep-never-1_2"}` || l.executions("keep-never-1") != 2 {
			t.Errorf("retry: %s after %d calls, want the second call's answer", body, l.executions("keep-never-1"))
		}
	})
}
