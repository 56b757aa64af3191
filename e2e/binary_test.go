package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/parallel"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

func TestMain(m *testing.M) {
	// Each test runs binaries on its own ports and stores, and mostly
	// waits on them.
	parallel.AtLeast(4)
	code := m.Run()
	binarytest.Cleanup()
	os.Exit(code)
}

// buildBinary is this tree's binary, built once per test process
// (internal/binarytest); IDEMPROXY_TEST_BINARY names another build to run
// instead, to try a test against an earlier release.
func buildBinary(t *testing.T) string { return binarytest.TestBinary(t) }

// sidecar is the real binary running for one test.
type sidecar = binarytest.Sidecar

// startBinary runs the binary on yaml (listen and admin_listen prepended
// on free loopback ports) until the test ends; ready (/readyz 200) when
// it returns.
func startBinary(t *testing.T, yaml string) *sidecar { return binarytest.T(t, yaml) }

// payConfig is the config most binary-level tests run on: POST /payments
// protected, the upstream and Redis at the addresses given, and extra
// lines after the store's Redis (store keys indented two spaces, or
// top-level sections such as defaults:).
func payConfig(upstream, redis, extra string) string {
	return fmt.Sprintf("upstream:\n  url: %q\nstore:\n  redis:\n    addrs: [%q]\n%sroutes:\n  - name: pay\n    match: \"POST /payments\"\n", upstream, redis, extra)
}

// eachStore runs f on the Redis store and on the PostgreSQL store, each on
// a server of its own: config is the pay route's config on that store,
// extra going after its store section (store keys at two spaces, then
// top-level sections), as payConfig's.
func eachStore(t *testing.T, f func(t *testing.T, config func(upstream, extra string) string)) {
	eachStoreValues(t, func(t *testing.T, config func(upstream, extra string) string, _ storeValues) { f(t, config) })
}

// storeValues reads every value the store holds, by key, as it holds it.
type storeValues func(t *testing.T) map[string][]byte

// eachStoreValues is eachStore, with a reader of what the store holds.
func eachStoreValues(t *testing.T, f func(t *testing.T, config func(upstream, extra string) string, values storeValues)) {
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, func(upstream, extra string) string { return payConfig(upstream, srv.Addr, extra) }, func(t *testing.T) map[string][]byte {
			ctx := context.Background()
			out := map[string][]byte{}
			for _, k := range srv.Client().Keys(ctx, "*").Val() {
				if v, err := srv.Client().Get(ctx, k).Bytes(); err == nil { // strings only: no counter holds an answer
					out[k] = v
				}
			}
			return out
		})
	})
	t.Run("postgres", func(t *testing.T) {
		pg := pgtest.Start(t)
		f(t, func(upstream, extra string) string { return pgConfig(upstream, pg.URL, extra) }, func(t *testing.T) map[string][]byte {
			ctx := context.Background()
			rows, err := pg.Conn(t).Query(ctx, "select key, idemproxy.idem_v"+strconv.Itoa(pgstore.SchemaVersion)+"_whole(key, value) from idemproxy.records") // a stream with its chunk rows
			if err != nil {
				t.Fatal(err)
			}
			out := map[string][]byte{}
			for rows.Next() {
				var k string
				var v []byte
				if err := rows.Scan(&k, &v); err != nil {
					t.Fatal(err)
				}
				out[k] = v
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return out
		})
	})
}

// The common requests and reads (internal/binarytest).
var (
	get        = binarytest.Get
	post       = binarytest.Post
	postWith   = binarytest.PostWith
	payRequest = binarytest.PayRequest
	scrape     = binarytest.Scrape
	storeUp    = binarytest.StoreUp
)

// postAnswer is post, returning the whole answer (its body read).
func postAnswer(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	return postWith(t, url, "alice", key, body, nil)
}

// postAnswerAs is postAnswer as principal.
func postAnswerAs(t *testing.T, url, principal, key, body string) (*http.Response, string) {
	t.Helper()
	return postWith(t, url, principal, key, body, nil)
}

// postFirstSent posts a payment as alice with key, saying it was first
// sent at firstSent (Repeatability-First-Sent), and answers status and
// body.
func postFirstSent(t *testing.T, url, key string, firstSent time.Time) (int, string) {
	t.Helper()
	resp, b := postWith(t, url, "alice", key, `{"amount":1}`, http.Header{"Repeatability-First-Sent": {firstSent.UTC().Format(http.TimeFormat)}})
	return resp.StatusCode, b
}

// metric reports whether a line of admin's /metrics starts with line:
// samples only, so "# HELP x 1 once …" does not pass for the sample "x 1".
func metric(t *testing.T, admin, line string) bool {
	t.Helper()
	return strings.Contains("\n"+scrape(t, admin), "\n"+line)
}

// outcome reads idemproxy_requests_total for route and outcome from admin.
func outcome(t *testing.T, admin, route, outcome string) string {
	t.Helper()
	_, text := get(t, admin+"/metrics")
	prefix := fmt.Sprintf("idemproxy_requests_total{outcome=%q,route=%q} ", outcome, route)
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	return "absent"
}

// TestRedisOutageKeepsTheSidecarReady: with Redis stopped the sidecar stays
// ready, serves pass-through and fail_open routes, answers fail_closed
// routes 503 store-unavailable without forwarding, reports
// idemproxy_store_up 0 and counts nothing as the dual-write window; once
// Redis is back, protected routes work again without a restart. Then the
// same with Redis down from the start, and with
// admin.readiness_requires_store, which couples readiness to Redis again.
func TestRedisOutageKeepsTheSidecarReady(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	srv := redistest.Start(t)
	var executed atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost {
			executed.Add(1)
			w.WriteHeader(http.StatusCreated)
		}
		fmt.Fprintln(w, `{"ok":true}`)
	}))
	defer upstream.Close()
	yaml := func(extra string) string {
		return fmt.Sprintf(`upstream:
  url: %q
store:
  redis:
    addrs: [%q]
%sroutes:
  - name: pay
    match: "POST /payments"
  - name: open
    match: "POST /open"
    store_unavailable: fail_open
`, upstream.URL, srv.Addr, extra)
	}
	sc := startBinary(t, yaml(""))
	if status, body := post(t, sc.Client+"/payments", "before", `{}`); status != http.StatusCreated {
		t.Fatalf("with Redis up: %d %s", status, body)
	}
	poll.Until(t, "idemproxy_store_up 1", func() bool { seen, up := storeUp(t, sc.Admin); return seen && up })

	srv.Stop()
	poll.Until(t, "idemproxy_store_up 0", func() bool { seen, up := storeUp(t, sc.Admin); return seen && !up })
	if status, body := get(t, sc.Admin+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz with Redis down: %d %s, want 200", status, body)
	}
	if _, body := get(t, sc.Admin+"/readyz?verbose"); !strings.Contains(body, "store: up=false") {
		t.Errorf("/readyz?verbose does not say the store is down: %s", body)
	}
	if status, _ := get(t, sc.Client+"/catalog"); status != http.StatusOK {
		t.Errorf("pass-through GET with Redis down: %d, want 200", status)
	}
	before := executed.Load()
	if status, body := post(t, sc.Client+"/payments", "during", `{}`); status != http.StatusServiceUnavailable || !strings.Contains(body, "store-unavailable") {
		t.Errorf("fail_closed route with Redis down: %d %s, want 503 store-unavailable", status, body)
	}
	if executed.Load() != before {
		t.Errorf("fail_closed forwarded a request with Redis down")
	}
	if status, _ := post(t, sc.Client+"/open", "during", `{}`); status != http.StatusCreated {
		t.Errorf("fail_open route with Redis down: %d, want the upstream's 201", status)
	}
	if v := outcome(t, sc.Admin, "pay", "store_error"); v != "0" {
		t.Errorf("store_error (the dual-write window) = %s with nothing forwarded, want 0", v)
	}
	if v := outcome(t, sc.Admin, "pay", "store_unavailable"); v != "1" {
		t.Errorf("store_unavailable = %s, want 1", v)
	}

	srv.Restart()
	poll.Until(t, "idemproxy_store_up 1 again", func() bool { seen, up := storeUp(t, sc.Admin); return seen && up })
	if status, body := post(t, sc.Client+"/payments", "after", `{}`); status != http.StatusCreated {
		t.Fatalf("with Redis back: %d %s, want 201", status, body)
	}
	if status, _ := post(t, sc.Client+"/payments", "after", `{}`); status != http.StatusCreated {
		t.Fatalf("replay with Redis back: %d", status)
	}

	t.Run("down at start", func(t *testing.T) {
		srv.Stop()
		defer srv.Restart()
		sc := binarytest.T(t, yaml(""), binarytest.Options{Live: true})
		poll.Until(t, "idemproxy_store_up 0", func() bool { seen, up := storeUp(t, sc.Admin); return seen && !up })
		// Never seen its store work since start: not ready (issue 79),
		// so a rollout waits on it rather than replacing pods that work.
		if status, body := get(t, sc.Admin+"/readyz"); status != http.StatusServiceUnavailable {
			t.Fatalf("/readyz with Redis down at start: %d %s, want 503", status, body)
		}
		if status, body := post(t, sc.Client+"/payments", "k", `{}`); status != http.StatusServiceUnavailable || !strings.Contains(body, "store-unavailable") {
			t.Errorf("protected route: %d %s, want 503 store-unavailable", status, body)
		}
		srv.Restart()
		poll.Until(t, "a protected request succeeds once Redis is up", func() bool {
			status, _ := post(t, sc.Client+"/payments", "k2", `{}`)
			return status == http.StatusCreated
		})
		poll.Until(t, "/readyz 200 once the scripts are loaded", func() bool { s, _ := get(t, sc.Admin+"/readyz"); return s == http.StatusOK })
	})
	t.Run("readiness_requires_store", func(t *testing.T) {
		sc := startBinary(t, yaml("admin:\n  readiness_requires_store: true\n"))
		poll.Until(t, "/readyz 200 with Redis up", func() bool { s, _ := get(t, sc.Admin+"/readyz"); return s == http.StatusOK })
		srv.Stop()
		defer srv.Restart()
		poll.Until(t, "/readyz 503 with Redis down", func() bool { s, _ := get(t, sc.Admin+"/readyz"); return s == http.StatusServiceUnavailable })
	})
}

// TestStartupFailures drives the real binary into every start-up failure:
// each is one line on stderr naming the YAML path or address, exit code 1,
// never a panic; and -check reports the same file problems.
func TestStartupFailures(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().String()
	free := func() string { p, _ := loopback.FreePort(); return fmt.Sprintf("127.0.0.1:%d", p) }
	short := write("short-token", "too-short\n")
	notBase64 := write("not-base64", "!!!\n")
	badCA := write("bad-ca.pem", "not a certificate\n")
	cases := []struct {
		name string
		yaml string
		want []string // each must be in the one line
		// check is whether -check must report it too (address problems
		// are found only by binding)
		check bool
		// path, when set, is the config file as it is (yaml is unused).
		path string
	}{
		{"listen in use", fmt.Sprintf("listen: %q\nadmin_listen: %q\n", busy, free()), []string{"listen", busy, "address already in use"}, false, ""},
		{"admin_listen in use", fmt.Sprintf("listen: %q\nadmin_listen: %q\n", free(), busy), []string{"admin_listen", busy}, false, ""},
		{"admin_pprof_listen in use", fmt.Sprintf("listen: %q\nadmin_listen: %q\nadmin_pprof_listen: %q\n", free(), free(), busy), []string{"admin_pprof_listen", busy}, false, ""},
		{"missing token file", "admin:\n  token_file: " + filepath.Join(dir, "nope") + "\n", []string{"admin.token_file", "no such file"}, true, ""},
		{"short token file", "admin:\n  token_file: " + short + "\n", []string{"admin.token_file", "at least 16"}, true, ""},
		{"missing sealing key", "store:\n  encryption:\n    key_files: [" + filepath.Join(dir, "nokey") + "]\n", []string{"store.encryption.key_files[0]", "no such file"}, true, ""},
		{"key secret not base64", "store:\n  key_secret_file: " + notBase64 + "\n", []string{"store.key_secret_file", "not base64"}, true, ""},
		{"missing password file", "store:\n  redis:\n    addrs: [\"127.0.0.1:1\"]\n    password_file: " + filepath.Join(dir, "nopw") + "\n", []string{"store.redis.password_file", "no such file"}, true, ""},
		{"bad TLS CA file", "store:\n  redis:\n    addrs: [\"127.0.0.1:1\"]\n    tls: true\n    tls_ca_file: " + badCA + "\n", []string{"store.redis.tls_ca_file"}, true, ""},
		{"missing config file", "", []string{"missing.yaml", "no such file"}, true, ""},
		// A config path to a device without end (issue 31: idemproxy size
		// -config /dev/zero grew to 23 GB): one line, at once.
		{"config file without end", "", []string{"/dev/zero", "larger than the 4 MiB"}, true, "/dev/zero"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "missing.yaml")
			if tc.path != "" {
				path = tc.path
			}
			if tc.yaml != "" {
				y := tc.yaml
				if !strings.Contains(y, "listen:") {
					y = fmt.Sprintf("listen: %q\nadmin_listen: %q\n", free(), free()) + y
				}
				path = write(strings.ReplaceAll(tc.name, " ", "-")+".yaml", y+"routes:\n  - name: pay\n    match: \"POST /payments\"\n")
			}
			for _, args := range [][]string{{"-config", path}, {"-config", path, "-check"}} {
				check := len(args) == 3
				if check && !tc.check {
					continue
				}
				cmd := exec.Command(bin, args...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				done := make(chan error, 1)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go func() { done <- cmd.Wait() }()
				select {
				case err = <-done:
				case <-time.After(20 * time.Second):
					cmd.Process.Kill() // by the PID this test started
					<-done
					t.Fatalf("%v did not exit: it served instead of failing", args)
				}
				out := stderr.String()
				if code := cmd.ProcessState.ExitCode(); code != 1 {
					t.Errorf("%v: exit code %d, want 1\n%s", args, code, out)
				}
				if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
					t.Errorf("%v: panicked:\n%s", args, out)
				}
				var last string
				for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
					if !strings.HasPrefix(line, "{") { // the JSON log lines before it are warnings
						if last != "" {
							t.Errorf("%v: more than one error line:\n%s", args, out)
						}
						last = line
					}
				}
				for _, w := range tc.want {
					if !strings.Contains(last, w) {
						t.Errorf("%v: error line %q does not name %q", args, last, w)
					}
				}
			}
		})
	}
}

// TestCommandLine (issue 32), through the binary: -h lists every
// subcommand and exits 0, each subcommand's -h exits 0, and an argument
// nobody reads is refused with one line naming it (v0.4.0 exited 1 on -h
// without naming demo, keys or size, and ignored a stray argument).
func TestCommandLine(t *testing.T) {
	bin := buildBinary(t)
	runBin := func(args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill() // by the PID this test started
			<-done
			t.Fatalf("%v did not exit", args)
		}
		return cmd.ProcessState.ExitCode(), out.String()
	}
	code, out := runBin("-h")
	if code != 0 {
		t.Errorf("-h: exit %d, want 0", code)
	}
	for _, sub := range []string{"demo", "keys", "size", "-check", "-version"} {
		if !strings.Contains(out, sub) {
			t.Errorf("-h does not mention %s:\n%s", sub, out)
		}
	}
	for _, args := range [][]string{{"demo", "-h"}, {"keys", "-h"}, {"keys", "get", "-h"}, {"size", "-h"}} {
		if code, out := runBin(args...); code != 0 {
			t.Errorf("%v: exit %d, want 0\n%s", args, code, out)
		}
	}
	// -check reads the files the config names; -skip-files (CI, outside
	// the pod, where the Secrets are not mounted) does not, and says so.
	missing := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(missing, []byte("admin:\n  token_file: /nonexistent/token\nroutes:\n  - name: pay\n    match: \"POST /payments\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runBin("-config", missing, "-check"); code != 1 || !strings.Contains(out, "admin.token_file") {
		t.Errorf("-check with a missing token file: exit %d %q, want 1 naming admin.token_file", code, out)
	}
	if code, out := runBin("-config", missing, "-check", "-skip-files"); code != 0 || !strings.Contains(out, "were not read") {
		t.Errorf("-check -skip-files with a missing token file: exit %d %q, want 0 saying the files were not read", code, out)
	}
	for _, args := range [][]string{{"-config", "config.example.yaml", "-check", "stray"}, {"serve"}, {"size", "-new-keys-per-second", "10", "extra"}} {
		code, out := runBin(args...)
		if code != 1 || !strings.Contains(out, "unexpected argument") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%v: exit %d %q, want 1 and one line naming the argument", args, code, out)
		}
	}
	// demo -listen (issue 79): the show runs on the given address, and a
	// given address in use is one line and exit 1 (the default 8080 falls
	// back to a free port instead; v0.8.0 had no -listen).
	port, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if code, out := runBin("demo", "-once", "-listen", addr); code != 0 || !strings.Contains(out, "sidecar http://"+addr+" ") {
		t.Errorf("demo -once -listen %s: exit %d, want 0 and the sidecar on it:\n%s", addr, code, out)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	code, out = runBin("demo", "-once", "-listen", taken.Addr().String())
	if code != 1 || !strings.Contains(out, "-listen "+taken.Addr().String()) || !strings.Contains(out, "address already in use") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Errorf("demo -listen on a port in use: exit %d %q, want 1 and one line naming -listen", code, out)
	}
}

// TestBuildInfoMetric (issue 32): the running binary says which build it
// is on /metrics: idemproxy_build_info{version,revision,goversion} 1, the
// version being CHANGELOG.md's (TestVersionMatchesChangelog ties them).
func TestBuildInfoMetric(t *testing.T) {
	sc := startBinary(t, "routes:\n  - name: pay\n    match: \"POST /payments\"\n")
	text := scrape(t, sc.Admin)
	var line string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(l, "idemproxy_build_info{") {
			line = l
		}
	}
	out, err := exec.Command(buildBinary(t), "-version").Output()
	if err != nil {
		t.Fatalf("-version: %v", err)
	}
	fields := strings.Fields(string(out)) // "idemproxy <version> ...": root's TestVersionFlag and TestVersionMatchesChangelog
	if len(fields) < 2 {
		t.Fatalf("-version printed %q", out)
	}
	version := fields[1]
	if !strings.Contains(line, `version="`+version+`"`) || !strings.Contains(line, `goversion="`+runtime.Version()+`"`) || !strings.HasSuffix(line, " 1") {
		t.Errorf("idemproxy_build_info: %q, want version %s and goversion %s, value 1", line, version, runtime.Version())
	}
	if !strings.Contains(line, `revision="`) {
		t.Errorf("idemproxy_build_info has no revision label: %q", line)
	}
}
