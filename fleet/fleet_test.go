package fleet

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// build builds the previous release and this tree, and returns their
// binaries.
func build(t *testing.T) (old, cur string) {
	t.Helper()
	mayBuild(t)
	old, err := binarytest.PreviousT(t).Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return old, binarytest.TestBinary(t)
}

// mayBuild skips t unless older releases may be built here: building one
// compiles everything once more (minutes on a first run); CI does (it sets
// IDEMPROXY_REQUIRE_PREVIOUS=1), and IDEMPROXY_FLEET=1 does here.
func mayBuild(t *testing.T) {
	t.Helper()
	if testing.Short() || raceEnabled {
		t.Skip("builds and runs two binaries: runs in the plain go test pass, not under -short or -race")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not in PATH")
	}
	if os.Getenv("IDEMPROXY_REQUIRE_PREVIOUS") != "1" && os.Getenv("IDEMPROXY_FLEET") != "1" {
		t.Skip("builds an older release: set IDEMPROXY_FLEET=1 to run it here (CI always does)")
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	binarytest.Cleanup()
	os.Exit(code)
}

// sidecar is one running binary, named for the messages.
type sidecar struct {
	*binarytest.Sidecar
	name string
}

// start runs bin on yaml with env added until the test ends; ready
// (/readyz 200) when it returns.
func start(t *testing.T, name, bin, yaml string, env ...string) *sidecar {
	t.Helper()
	return &sidecar{Sidecar: binarytest.StartT(t, bin, yaml, binarytest.Options{Env: env}), name: name}
}

func (s *sidecar) log() string { return s.Logs() }

// answer is what a client got.
type answer struct {
	status   int
	body     string
	replayed bool
}

func (s *sidecar) pay(t *testing.T, key, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.Client+"/payments", strings.NewReader(body))
	req.Header.Set("X-Forwarded-User", "alice")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return s.send(t, req)
}

// send sends req to s and returns what came back.
func (s *sidecar) send(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"}
}

// TestMixedFleet runs the previous release and this tree against one
// redis-server, for each shipped feature set (defaults; sealed records
// with a key secret; tracing on for the new version only), and crosses
// them as a rolling upgrade does: a first attempt on one version and its
// retries on the other, both ways; concurrent pairs of one key split
// across the versions. No answer may be a 500 (a record one version cannot
// read) or a 422 (a fingerprint one version computes differently); every
// key executes once, and every retry gets the first answer byte for byte.
func TestMixedFleet(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("builds and runs two binaries: runs in the plain go test pass, not under -short or -race")
	}
	oldBin, curBin := build(t)
	dir := t.TempDir()
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))
	keyFile, secretFile := filepath.Join(dir, "key"), filepath.Join(dir, "secret")
	if err := os.WriteFile(keyFile, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	defer collector.Close()

	for _, fs := range []struct {
		name       string
		store      string   // under store:, both versions
		newEnv     []string // the new version's environment only
		oldSkipped bool
		postgres   bool // on the PostgreSQL store (both create_schema: true), the previous pod restarted mid-way
	}{
		{name: "defaults"},
		{name: "sealed with a key secret", store: fmt.Sprintf("  encryption:\n    key_files: [%q]\n  key_secret_file: %q\n", keyFile, secretFile)},
		{name: "tracing on the new version only", newEnv: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}},
		{name: "postgres", postgres: true},
	} {
		t.Run(fs.name, func(t *testing.T) {
			upstream := binarytest.NewRecorder(t)
			upstream.Delay = 20 * time.Millisecond // long enough for a concurrent retry to find the claim
			var yaml string
			var pg *pgtest.Server
			if fs.postgres {
				pg = pgtest.Start(t)
				yaml = fmt.Sprintf("upstream:\n  url: %q\nstore:\n  postgres:\n    url: %q\n%sroutes:\n  - name: pay\n    match: \"POST /payments\"\n", upstream.URL, pg.URL, fs.store)
			} else {
				srv := redistest.Start(t)
				yaml = fmt.Sprintf("upstream:\n  url: %q\nstore:\n  redis:\n    addrs: [%q]\n%sroutes:\n  - name: pay\n    match: \"POST /payments\"\n", upstream.URL, srv.Addr, fs.store)
			}
			old := start(t, "previous", oldBin, yaml)
			cur := start(t, "current", curBin, yaml, fs.newEnv...)
			check := func(where string, a answer) {
				t.Helper()
				if a.status == http.StatusInternalServerError || a.status == http.StatusUnprocessableEntity {
					t.Errorf("%s: %d %s\nprevious:\n%s\ncurrent:\n%s", where, a.status, a.body, old.log(), cur.log())
				}
			}
			var keys []string
			for _, pair := range [][2]*sidecar{{old, cur}, {cur, old}} {
				for i := range 5 {
					k := fmt.Sprintf("%s-then-%s-%d", pair[0].name, pair[1].name, i)
					keys = append(keys, k)
					body := fmt.Sprintf(`{"amount":%d}`, 100+i)
					first := pair[0].pay(t, k, body)
					check(k+" first attempt", first)
					if first.status != http.StatusCreated {
						t.Fatalf("%s first attempt on %s: %d %s", k, pair[0].name, first.status, first.body)
					}
					for _, s := range []*sidecar{pair[1], pair[0], pair[1]} {
						retry := s.pay(t, k, body)
						check(k+" retry on "+s.name, retry)
						if retry.status != first.status || retry.body != first.body || !retry.replayed {
							t.Errorf("%s retry on %s: %d %q replayed=%t, want %d %q replayed", k, s.name, retry.status, retry.body, retry.replayed, first.status, first.body)
						}
					}
				}
			}
			if fs.postgres {
				// A previous pod restarted during the rollout reinstalls its
				// own functions (create_schema: true): the current pods'
				// must stay as they were.
				bodies := func() string {
					var sum string
					if err := pg.Conn(t).QueryRow(t.Context(), `SELECT coalesce(md5(string_agg(prosrc, '|' ORDER BY oid::regprocedure::text)), '') FROM pg_proc WHERE proname LIKE '`+pgstore.FunctionPattern()+`'`).Scan(&sum); err != nil {
						t.Fatal(err)
					}
					return sum
				}
				before := bodies()
				if before == "" {
					t.Fatal("the current pod installed no versioned functions")
				}
				if err := old.Restart(binarytest.Options{}); err != nil {
					t.Fatal(err)
				}
				if after := bodies(); after != before {
					t.Errorf("the previous pod's restart changed the current pods' functions")
				}
			}
			for i := range 10 {
				k := fmt.Sprintf("concurrent-%d", i)
				keys = append(keys, k)
				body := fmt.Sprintf(`{"amount":%d}`, 200+i)
				var wg sync.WaitGroup
				got := make([]answer, 2)
				for j, s := range []*sidecar{old, cur} {
					wg.Go(func() { got[j] = s.pay(t, k, body) })
				}
				wg.Wait()
				for j, a := range got {
					check(fmt.Sprintf("%s concurrent on %d", k, j), a)
					if a.status != http.StatusCreated && a.status != http.StatusConflict {
						t.Errorf("%s concurrent: %d %s, want 201 or 409", k, a.status, a.body)
					}
				}
				var settled string
				for _, s := range []*sidecar{old, cur, old, cur} {
					var a answer
					for range 100 {
						if a = s.pay(t, k, body); a.status != http.StatusConflict {
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
					check(k+" retry on "+s.name, a)
					if a.status != http.StatusCreated {
						t.Fatalf("%s retry on %s: %d %s", k, s.name, a.status, a.body)
					}
					if settled == "" {
						settled = a.body
					} else if a.body != settled {
						t.Errorf("%s: %s replayed %q, another retry got %q", k, s.name, a.body, settled)
					}
				}
			}
			for _, k := range keys {
				if n := upstream.Executions(k); n != 1 {
					t.Errorf("key %s executed %d times, want 1", k, n)
				}
			}
		})
	}
}

// TestWebhookRedeliveryAcrossTheUpgrade (issue 41): the previous release
// keyed GitHub deliveries by their delivery id and scoped webhook routes
// as configured (here defaults.scope: principal); this tree keys GitHub
// by the body's SHA-256 and always scopes by route. A delivery the
// previous release executed, redelivered to this tree, is replayed from
// the record the previous release wrote, not executed again.
func TestWebhookRedeliveryAcrossTheUpgrade(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("builds and runs two binaries: runs in the plain go test pass, not under -short or -race")
	}
	oldBin, curBin := build(t)
	dir := t.TempDir()
	ghFile, stripeFile := filepath.Join(dir, "gh"), filepath.Join(dir, "stripe")
	const ghSecret, stripeSecret = "gh-secret-0123", "whsec_0123456789abcdef"
	if err := os.WriteFile(ghFile, []byte(ghSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stripeFile, []byte(stripeSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	var mu sync.Mutex
	executed := map[string]int{}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		executed[r.URL.Path+" "+string(b)]++
		n := executed[r.URL.Path+" "+string(b)]
		mu.Unlock()
		fmt.Fprintf(w, `{"n":%d}`, n)
	}))
	defer upstream.Close()
	yaml := fmt.Sprintf(`upstream:
  url: %q
store:
  redis:
    addrs: [%q]
defaults:
  scope: principal
routes:
  - name: github-events
    match: "POST /webhooks/github"
    webhook: {provider: github, secret_files: [%q]}
  - name: stripe-events
    match: "POST /webhooks/stripe"
    webhook: {provider: stripe, secret_files: [%q]}
`, upstream.URL, srv.Addr, ghFile, stripeFile)
	old := start(t, "previous", oldBin, yaml)
	cur := start(t, "current", curBin, yaml)
	deliver := func(s *sidecar, provider, id, body string) answer {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.Client+"/webhooks/"+provider, strings.NewReader(body))
		switch provider {
		case "github":
			req.Header.Set("X-Hub-Signature-256", "sha256="+hmacHex(ghSecret, body))
			req.Header.Set("X-GitHub-Delivery", id)
			req.Header.Set("X-GitHub-Event", "push") // GitHub always names the event
		case "stripe":
			ts := fmt.Sprint(time.Now().Unix())
			req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hmacHex(stripeSecret, ts+"."+body))
		}
		return s.send(t, req)
	}
	for _, provider := range []string{"github", "stripe"} {
		body := fmt.Sprintf(`{"id":"evt_%s_1","type":"charge.succeeded"}`, provider)
		first := deliver(old, provider, "dlv-1", body)
		if first.status != http.StatusOK {
			t.Fatalf("%s: the first delivery on the previous release: %d %s\n%s", provider, first.status, first.body, old.log())
		}
		again := deliver(cur, provider, "dlv-1", body)
		if again.status != first.status || again.body != first.body || !again.replayed {
			t.Errorf("%s: the redelivery on this tree: %d %s replayed=%t, want the first answer replayed\n%s", provider, again.status, again.body, again.replayed, cur.log())
		}
		mu.Lock()
		if n := executed["/webhooks/"+provider+" "+body]; n != 1 {
			t.Errorf("%s: executed %d times across the upgrade, want 1", provider, n)
		}
		mu.Unlock()
	}
}

func hmacHex(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}
