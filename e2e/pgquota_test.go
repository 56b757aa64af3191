package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestQuotaCountersNeverDeadlock (issue 78, item 3): with quota.new_keys
// set, a claim also takes its principal's counter row. Counted inside each
// claim, in a batch sorted by the records' keys, two batches could take
// two principals' counters in opposite orders: with two principals, or
// one on two routes, they deadlocked, stalled for deadlock_timeout and
// answered 503 (121-275 of them a run). Through the binary, two
// principals on two routes at once, batched: every first attempt
// answered 201, and PostgreSQL counts no deadlock.
func TestQuotaCountersNeverDeadlock(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	cfg := fmt.Sprintf(`upstream:
  url: %q
store:
  postgres:
    url: %q
defaults:
  quota:
    new_keys: 100000
    window: 1h
routes:
  - name: pay
    match: "POST /payments"
  - name: order
    match: "POST /orders"
`, up.URL, pg.URL)
	sc := startBinary(t, cfg)
	deadlocks := func() int64 {
		var n int64
		if err := pg.Conn(t).QueryRow(context.Background(), "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := deadlocks()
	var mu sync.Mutex
	refused := map[int]int{}
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			principal := []string{"alice", "bob"}[w%2]
			path := []string{"/payments", "/orders"}[(w/2)%2]
			for i := range 40 {
				resp, body := postAnswerAs(t, sc.Client+path, principal, fmt.Sprintf("q-%d-%d", w, i), `{"amount":1}`)
				if resp.StatusCode != http.StatusCreated {
					mu.Lock()
					if refused[resp.StatusCode]++; refused[resp.StatusCode] == 1 {
						t.Errorf("%s %s: %d %s", principal, path, resp.StatusCode, body)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(refused) > 0 {
		t.Errorf("answers other than 201, by status: %v", refused)
	}
	if n := deadlocks() - before; n != 0 {
		t.Errorf("PostgreSQL counted %d deadlocks, want 0", n)
	}
	if n := up.Total(); n != 32*40 {
		t.Errorf("%d executions, want %d", n, 32*40)
	}
}
