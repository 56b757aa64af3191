package binarytest

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// The harness runs the real binary: ready when T returns, a request
// reaches the Recorder once, a restart keeps the ports and the record
// (Redis), Stop is a clean exit, and the log holds every run.
func TestHarness(t *testing.T) {
	srv := redistest.Start(t)
	up := NewRecorder(t)
	s := T(t, fmt.Sprintf("upstream:\n  url: %q\nstore:\n  redis:\n    addrs: [%q]\nroutes:\n  - name: pay\n    match: \"POST /payments\"\n", up.URL, srv.Addr))
	pay := func() int {
		req, _ := http.NewRequest(http.MethodPost, s.Client+"/payments", strings.NewReader(`{}`))
		req.Header.Set("X-Forwarded-User", "alice")
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := pay(); got != http.StatusCreated {
		t.Fatalf("first attempt: %d\n%s", got, s.Logs())
	}
	pid := s.PID()
	if err := s.Restart(Options{}); err != nil {
		t.Fatal(err)
	}
	if s.PID() == pid {
		t.Fatal("Restart kept the old process")
	}
	if got := pay(); got != http.StatusCreated || up.Executions("k") != 1 || up.Total() != 1 {
		t.Fatalf("retry after a restart: %d, %d executions", got, up.Executions("k"))
	}
	if err := s.Stop(10 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, s.Logs())
	}
	// Each run warns at start (warnings are written at once; a kill may
	// lose the last 100 ms of routine lines), and the stop is logged.
	if n := strings.Count(s.Logs(), "quota.new_keys: 0"); n != 2 || !strings.Contains(s.Logs(), `"msg":"stopped"`) {
		t.Errorf("the log holds %d starts, want 2, and the stop:\n%s", n, s.Logs())
	}
}

// A binary that cannot start is an error naming why, not a hang.
func TestStartFails(t *testing.T) {
	_, err := Start(TestBinary(t), t.TempDir(), "routes: [\n", Options{})
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("a broken config: %v", err)
	}
}

// A run's output can go to a file of its own (chaos keeps one per run),
// closed when the process exits; Kill and Signal on a sidecar that never
// ran do nothing.
func TestRunLogsToItsOwnFile(t *testing.T) {
	bin := TestBinary(t)
	dir := t.TempDir()
	never := New(bin, filepath.Join(dir, "none.yaml"), 1, 2)
	never.Kill()
	if err := never.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal on a sidecar that never ran: %v", err)
	}
	up := NewRecorder(t)
	srv := redistest.Start(t)
	s := T(t, fmt.Sprintf("upstream:\n  url: %q\nstore:\n  redis:\n    addrs: [%q]\n", up.URL, srv.Addr), Options{Live: true})
	path := filepath.Join(dir, "run.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(Options{Live: true, Stderr: f}); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Error("the run's log file is still open after the process exited")
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"msg":"stopped"`) {
		t.Errorf("the run's log file: %q", b)
	}
	if strings.Contains(s.Logs(), `"msg":"stopped"`) {
		t.Error("the run that logged to a file also logged to the sidecar's log")
	}
}
