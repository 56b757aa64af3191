package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestRecordLostThroughTheBinary (issue 33): a payment executes; Redis
// restarts without its data (no persistence); the client's retry, which
// says when it first sent the request (Repeatability-First-Sent), finds no
// record and is refused 412 record-lost, the upstream never sees it again,
// and the loss is counted (idemproxy_store_data_lost_total) and logged. A
// request first sent after the restart executes as before. v0.4.0
// executed the retry a second time (IDEMPROXY_TEST_BINARY shows it).
func TestRecordLostThroughTheBinary(t *testing.T) {
	srv := redistest.Start(t)
	upstream := binarytest.NewRecorder(t)
	sc := startBinary(t, payConfig(upstream.URL, srv.Addr, ""))
	pay := func(key string, firstSent time.Time) (int, string) {
		t.Helper()
		return postFirstSent(t, sc.Client+"/payments", key, firstSent)
	}
	sent := time.Now().Add(-5 * time.Second) // the client's clock read it a while ago
	if status, body := pay("charge-1", sent); status != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", status, body)
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch

	srv.Restart() // Redis comes back empty: the record is gone
	var status int
	var body string
	poll.Until(t, "the retry is answered (not 503 while Redis comes back)", func() bool {
		status, body = pay("charge-1", sent)
		return status != http.StatusServiceUnavailable
	})
	if status != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
		t.Errorf("the retry after the store lost its data: %d %s, want 412 record-lost", status, body)
	}
	if n := upstream.Executions("charge-1"); n != 1 {
		t.Errorf("upstream executed %d times, want 1", n)
	}
	if status, body := pay("charge-2", time.Now()); status != http.StatusCreated {
		t.Errorf("a request first sent after the restart: %d %s, want 201", status, body)
	}
	poll.Until(t, "the loss is counted", func() bool {
		return strings.Contains(scrape(t, sc.Admin), `idemproxy_store_data_lost_total{master="`+srv.Addr+`"} 1`)
	})
	if !strings.Contains(sc.Logs(), "the store lost its data") {
		t.Errorf("no log line says the store lost its data:\n%s", sc.Logs())
	}
}
