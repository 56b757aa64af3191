package e2e

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// wakeups is idemproxy_store_wakeups_total{how} on admin.
func wakeups(t *testing.T, admin, how string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^idemproxy_store_wakeups_total\{how="` + how + `"\} (\S+)$`).FindStringSubmatch(scrape(t, admin))
	if m == nil {
		t.Fatalf("no idemproxy_store_wakeups_total{how=%q} series", how)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPostgresBehindPgBouncer (issue 62): the sidecar through a real
// PgBouncer in transaction mode. Concurrent attempts of one key under
// concurrent: wait execute it once and every waiter gets its answer,
// woken by a NOTIFY (store.postgres.listen_url reaches the database
// straight); nothing answers 503. Without listen_url the LISTEN sits on a
// pooled connection and hears nothing: the sidecar says so within a few
// seconds, naming the key, and its waiters still get their answers, by
// their poll. v0.7.0 answered 503 (its named prepared statements), stored
// nothing for a 201 and kept waiters for the whole max_wait.
func TestPostgresBehindPgBouncer(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	b := pg.Bouncer(t)
	up := binarytest.NewRecorder(t)
	up.Delay = 700 * time.Millisecond
	defaults := "defaults:\n  concurrent: wait\n  max_wait: 10s\n"
	burst := func(sc *sidecar, key string) {
		t.Helper()
		var wg sync.WaitGroup
		bodies := make([]string, 3)
		for i := range bodies {
			wg.Go(func() {
				st, body := post(t, sc.Client+"/payments", key, `{}`)
				if st != http.StatusCreated {
					t.Errorf("%s, attempt %d: %d %s, want 201", key, i, st, body)
				}
				bodies[i] = body
			})
			time.Sleep(50 * time.Millisecond)
		}
		wg.Wait()
		if bodies[1] != bodies[0] || bodies[2] != bodies[0] {
			t.Errorf("%s: answers %q, want one answer", key, bodies)
		}
		if n := up.Executions(key); n != 1 {
			t.Errorf("%s executed %d times, want 1", key, n)
		}
	}

	sc := startBinary(t, pgConfig(up.URL, b.URL, fmt.Sprintf("    listen_url: %q\n", pg.URL)+defaults))
	burst(sc, "bounced-1")
	if n := wakeups(t, sc.Admin, "notify"); n < 1 {
		t.Errorf("no waiter was woken by a NOTIFY (%v), want the two waiters woken so", n)
	}

	deaf := startBinary(t, pgConfig(up.URL, b.URL, defaults))
	poll.Until(t, "the sidecar says its LISTEN hears nothing", func() bool {
		return strings.Contains(deaf.Logs(), "wake-ups do not arrive")
	})
	if !strings.Contains(deaf.Logs(), "store.postgres.listen_url") {
		t.Errorf("the warning does not name store.postgres.listen_url:\n%s", deaf.Logs())
	}
	if strings.Contains(sc.Logs(), "wake-ups do not arrive") {
		t.Errorf("the sidecar with listen_url says its wake-ups do not arrive:\n%s", sc.Logs())
	}
	burst(deaf, "bounced-2")
}
