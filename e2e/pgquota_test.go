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

// TestQuotaExactUnderConcurrency (issue 78): the quota is counted in a
// transaction of its own after the claims' commit; concurrent first
// attempts of one principal, batched, straight to PostgreSQL and through
// PgBouncer in transaction mode (where the count's transaction may land
// on another server than its claims'), still let exactly new_keys keys
// through: the rest answer 429, and nothing answers otherwise.
func TestQuotaExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	b := pg.Bouncer(t)
	const quota, workers, each = 50, 16, 10
	for _, via := range []struct{ name, url string }{{"straight", pg.URL}, {"through PgBouncer", b.URL}} {
		up := binarytest.NewRecorder(t)
		sc := startBinary(t, pgConfig(up.URL, via.url, fmt.Sprintf("    listen_url: %q\ndefaults:\n  quota:\n    new_keys: %d\n    window: 1h\n", pg.URL, quota)))
		var mu sync.Mutex
		statuses := map[int]int{}
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					resp, body := postAnswerAs(t, sc.Client+"/payments", "carol-"+via.name, fmt.Sprintf("exact-%d-%d", w, i), `{"amount":1}`)
					mu.Lock()
					if statuses[resp.StatusCode]++; resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusTooManyRequests && statuses[resp.StatusCode] == 1 {
						t.Errorf("%s: %d %s", via.name, resp.StatusCode, body)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		t.Logf("%s: %v", via.name, statuses)
		if statuses[http.StatusCreated] != quota || statuses[http.StatusTooManyRequests] != workers*each-quota {
			t.Errorf("%s: answers by status %v; want %d × 201 and %d × 429", via.name, statuses, quota, workers*each-quota)
		}
		if n := up.Total(); n != quota {
			t.Errorf("%s: %d executions, want %d", via.name, n, quota)
		}
	}
}
