package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestKilledOwnerIsSettledAsOutcomeUnknown runs the real binary with
// unknown_outcome: fail, SIGKILLs it while its upstream call is in flight
// and starts it again: retries get 409 during the dead owner's lease, then
// 502 outcome-unknown, replayed; the upstream executed once.
func TestKilledOwnerIsSettledAsOutcomeUnknown(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	srv := redistest.Start(t)
	bin := buildBinary(t)
	dir := t.TempDir()
	var calls atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		calls.Add(1) // acted; the answer comes too late for the killed sidecar
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	defer upstream.Close()
	port, _ := loopback.FreePort()
	admin, _ := loopback.FreePort()
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
upstream:
  url: %q
  timeout: 10s
store:
  redis:
    addrs: [%q]
defaults:
  lease: 3s
  unknown_outcome: fail
routes:
  - name: pay
    match: "POST /payments"
`, port, admin, upstream.URL, srv.Addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "-config", cfgPath)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		for range 200 {
			if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", admin)); err == nil {
				resp.Body.Close()
				return cmd
			}
			time.Sleep(25 * time.Millisecond)
		}
		t.Fatal("idemproxy did not come up")
		return nil
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	first := start()
	go func() {
		if resp, err := http.DefaultClient.Do(payRequest("http://"+addr+"/payments", "killed-1", "{}")); err == nil {
			resp.Body.Close()
		}
	}()
	poll.Until(t, "the request reaches the upstream", func() bool { return calls.Load() > 0 })
	first.Process.Kill() // SIGKILL, by the PID this test started
	first.Wait()
	start()
	if status, body := post(t, "http://"+addr+"/payments", "killed-1", "{}"); status != http.StatusConflict {
		t.Fatalf("retry during the dead owner's lease: %d %s, want 409", status, body)
	}
	var status int
	var body string
	poll.Until(t, "the dead owner's lease lapses", func() bool {
		status, body = post(t, "http://"+addr+"/payments", "killed-1", "{}")
		return status != http.StatusConflict
	})
	if status != http.StatusBadGateway || !strings.Contains(body, "outcome-unknown") {
		t.Fatalf("retry after the lease: %d %s, want 502 outcome-unknown", status, body)
	}
	if again, body2 := post(t, "http://"+addr+"/payments", "killed-1", "{}"); again != status || body2 != body {
		t.Fatalf("next retry: %d %s, want the same 502", again, body2)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}
