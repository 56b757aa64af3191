package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestKilledOwnerIsSettledAsOutcomeUnknown runs the real binary with
// unknown_outcome: fail, SIGKILLs it while its upstream call is in flight
// and starts it again: retries get 409 during the dead owner's lease, then
// 502 outcome-unknown, replayed; the upstream executed once. On each
// store (eachStore).
func TestKilledOwnerIsSettledAsOutcomeUnknown(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	eachStore(t, killedOwner)
}

// killedOwner is TestKilledOwnerIsSettledAsOutcomeUnknown on one store.
func killedOwner(t *testing.T, config func(upstream, extra string) string) {
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
	sc := startBinary(t, config(upstream.URL, "defaults:\n  lease: 3s\n  unknown_outcome: fail\n"))
	go func() {
		if resp, err := http.DefaultClient.Do(payRequest(sc.Client+"/payments", "killed-1", "{}")); err == nil {
			resp.Body.Close()
		}
	}()
	poll.Until(t, "the request reaches the upstream", func() bool { return calls.Load() > 0 })
	// SIGKILL, by the PID this test started, then the same binary again on
	// the same config and ports.
	if err := sc.Restart(binarytest.Options{}); err != nil {
		t.Fatal(err)
	}
	if status, body := post(t, sc.Client+"/payments", "killed-1", "{}"); status != http.StatusConflict {
		t.Fatalf("retry during the dead owner's lease: %d %s, want 409", status, body)
	}
	var status int
	var body string
	poll.Until(t, "the dead owner's lease lapses", func() bool {
		status, body = post(t, sc.Client+"/payments", "killed-1", "{}")
		return status != http.StatusConflict
	})
	if status != http.StatusBadGateway || !strings.Contains(body, "outcome-unknown") {
		t.Fatalf("retry after the lease: %d %s, want 502 outcome-unknown", status, body)
	}
	if again, body2 := post(t, sc.Client+"/payments", "killed-1", "{}"); again != status || body2 != body {
		t.Fatalf("next retry: %d %s, want the same 502", again, body2)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}
