package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/binarytest"
)

func TestCheckFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"-config", "config.example.yaml", "-check"}, &out, &errOut); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if !strings.Contains(out.String(), "valid, 3 routes") {
		t.Errorf("output %q", out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("defaults:\n  lease: banana\nroutes:\n  - name: a\n    match: \"POST /a\"\n  - name: a\n    match: \"POST /b\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"-config", bad, "-check"}, &out, &errOut)
	if err == nil {
		t.Fatal("invalid config passed -check")
	}
	for _, want := range []string{"defaults.lease: must be a duration", `routes[1].name: duplicate route name "a"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("-check error %q does not report %q", err, want)
		}
	}
}

func TestDemoShowsTheGuarantees(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"demo", "-once"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"1 x 201, 19 x 409",
		"201, Idempotent-Replayed: true, byte-identical body",
		"422 key-reused",
		"503 released, retry 201 executed",
		"1 x 201, 9 x 201 replayed; 1 distinct success body",
		"400 key-missing",
		"201 with the real charge (reconciled: true), retry 201 replayed: true",
		"401 signature-invalid, 201 executed, 201 replayed: true",
		"the retry attached (Idempotent-Replayed: true), same 5 events: true",
		"3 x OK with the same message and trailers (charge ch_0008), 2 replayed",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q:\n%s", want, text)
		}
	}
	// Charges so far (the last column): the reconciled charge was made
	// once, and so was the streamed generation its retry attached to.
	for row, charges := range map[string]string{"(reconcile)": "5", "(SSE)": "6", "hedged gRPC": "8"} {
		for line := range strings.Lines(text) {
			if f := strings.Fields(line); strings.Contains(line, row) && f[len(f)-1] != charges {
				t.Errorf("demo row %s: %s charges so far, want %s:\n%s", row, f[len(f)-1], charges, line)
			}
		}
	}
}

func TestVersionFlag(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-version"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "idemproxy ") || !strings.Contains(out.String(), "go1.") {
		t.Fatalf("-version printed %q", out.String())
	}
}

// startTest starts idemproxy for cfg, reloading from path when it is set,
// and stops it when the test ends. stop cancels it, as SIGTERM does, and
// returns what wait returned once the drain is over.
func startTest(t *testing.T, cfg *config.Config, path string, logger *slog.Logger) (s *server, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := start(ctx, cfg, path, logger)
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.wait(ctx) }()
	var once sync.Once
	var waitErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			waitErr = <-done
		})
		return waitErr
	}
	t.Cleanup(func() { stop() })
	return s, stop
}

// pay sends one protected POST and returns its status and body.
func pay(t *testing.T, addr, key string) (int, string) {
	t.Helper()
	return binarytest.Post(t, "http://"+addr+"/payments", key, "{}")
}

// TestPprofOnlyOnItsOwnLoopbackListener: pprof is never served next to the
// probes on the admin port, only on admin_pprof_listen.
func TestPprofOnlyOnItsOwnLoopbackListener(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen, cfg.AdminPprofListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	get := func(addr string) int {
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(s.adminAddr); got != http.StatusNotFound {
		t.Errorf("pprof on the admin port: %d, want 404", got)
	}
	if s.pprofAddr == "" || get(s.pprofAddr) != http.StatusOK {
		t.Errorf("pprof on admin_pprof_listen (%q): not served", s.pprofAddr)
	}
}

// The command line paragraph of docs/configuration.md names every form the
// binary's usage lists, so that a new flag or subcommand cannot reach the
// binary without reaching the docs (issue 46: the paragraph had fallen
// behind by -skip-files, keys and size).
func TestCLIParagraphCoversUsage(t *testing.T) {
	doc, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), "Command line (`idemproxy -h`)")
	if i < 0 {
		t.Fatal("docs/configuration.md has no command line paragraph")
	}
	para := string(doc[i:])
	para = para[:strings.Index(para, "\n## ")]
	for _, want := range []string{"-config", "-check", "-skip-files", "-version", "demo", "keys get|delete|reconcile", "size"} {
		if !strings.Contains(usage, want) {
			t.Errorf("the usage does not list %q any more: update this test and the docs", want)
		}
		if !strings.Contains(para, want) {
			t.Errorf("docs/configuration.md's command line paragraph does not name %q", want)
		}
	}
	if !strings.Contains(para, "streamed") {
		t.Error("the paragraph's keys delete does not list -state streamed")
	}
}

// TestReleaseBuildHasNoClockSeam: only the chaos harness's build
// (-tags chaosclock) steps the sidecar's wall clock; a release build
// reads time.Now.
func TestReleaseBuildHasNoClockSeam(t *testing.T) {
	if wallClock != nil {
		t.Fatal("wallClock is set in a build without -tags chaosclock")
	}
}
