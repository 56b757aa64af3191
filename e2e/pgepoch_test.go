package e2e

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// dataLost is the sum of idemproxy_store_data_lost_total on admin.
func dataLost(t *testing.T, admin string) float64 {
	t.Helper()
	var sum float64
	for _, m := range regexp.MustCompile(`(?m)^idemproxy_store_data_lost_total\{[^}]*\} (\S+)$`).FindAllStringSubmatch(scrape(t, admin), -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// TestPostgresAsyncFailoverIsALoss (issue 62, high): a primary with an
// asynchronous standby (PostgreSQL's default replication), the sidecar's
// URL naming both. A payment the primary acknowledged but never shipped
// (the standby cut off) is gone once the standby is promoted: its retry,
// which says when it was first sent, is refused 412 record-lost instead of
// executed again; the loss (the new timeline after asynchronous
// replication) is counted and logged; a payment shipped before the cut
// replays; a request first sent after the failover executes. v0.7.0
// executed the retry a second time.
func TestPostgresAsyncFailoverIsALoss(t *testing.T) {
	t.Parallel()
	primary := pgtest.Start(t)
	standby := primary.Standby(t)
	url := fmt.Sprintf("postgres://%s@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write", pgtest.User, primary.Addr, standby.Addr)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, url, ""))
	ctx := context.Background()
	sent := time.Now().Add(-2 * time.Second)
	pay := func(key string, firstSent time.Time) (int, string) {
		t.Helper()
		return postFirstSent(t, sc.Client+"/payments", key, firstSent)
	}
	st, kept := pay("shipped-1", sent)
	if st != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", st, kept)
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch

	// Everything so far reached the standby; then it is cut off.
	pc, sbc := primary.Conn(t), standby.Conn(t)
	var lsn string
	if err := pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the standby replayed the primary's WAL", func() bool {
		var caught bool
		err := sbc.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&caught)
		return err == nil && caught
	})
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := sbc.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "the standby stopped streaming", func() bool {
		var n int
		err := pc.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&n)
		return err == nil && n == 0
	})

	st, body := pay("unshipped-1", sent)
	if st != http.StatusCreated {
		t.Fatalf("the payment the standby never gets: %d %s", st, body)
	}
	primary.Kill()
	standby.Promote(t)

	poll.Until(t, "the retry is answered by the promoted standby", func() bool {
		st, body = pay("unshipped-1", sent)
		return st != http.StatusServiceUnavailable
	})
	if st != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
		t.Errorf("the retry of a payment lost in an asynchronous failover: %d %s, want 412 record-lost", st, body)
	}
	if n := up.Executions("unshipped-1"); n != 1 {
		t.Errorf("unshipped-1 executed %d times, want 1", n)
	}
	if st, body := pay("shipped-1", sent); st != http.StatusCreated || body != kept {
		t.Errorf("the retry of a payment the standby had: %d %q, want its first answer %q", st, body, kept)
	}
	if st, body := pay("after-1", time.Now()); st != http.StatusCreated {
		t.Errorf("a request first sent after the failover: %d %s, want 201", st, body)
	}
	if lost := dataLost(t, sc.Admin); lost != 1 {
		t.Errorf("idemproxy_store_data_lost_total is %v, want 1", lost)
	}
	if !strings.Contains(sc.Logs(), "timeline changed") {
		t.Errorf("no log line says why the store lost its data:\n%s", sc.Logs())
	}
}

// TestPostgresTruncateIsALoss (issue 62): the records table emptied under
// a running sidecar (TRUNCATE) is a loss, as a flushed Redis is: the
// retry of a payment first sent before it gets 412 record-lost, executed
// once, and the loss is counted (v0.7.0's PostgreSQL store never moved
// idemproxy_store_data_lost_total) and logged.
func TestPostgresTruncateIsALoss(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, pg.URL, ""))
	sent := time.Now().Add(-2 * time.Second)
	if st, body := postFirstSent(t, sc.Client+"/payments", "truncated-1", sent); st != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", st, body)
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch
	if lost := dataLost(t, sc.Admin); lost != 0 {
		t.Fatalf("idemproxy_store_data_lost_total is %v before any loss, want 0 (and the series there)", lost)
	}
	if _, err := pg.Conn(t).Exec(context.Background(), "TRUNCATE idemproxy.records"); err != nil {
		t.Fatal(err)
	}
	st, body := postFirstSent(t, sc.Client+"/payments", "truncated-1", sent)
	if st != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
		t.Errorf("the retry after the records were truncated: %d %s, want 412 record-lost", st, body)
	}
	if n := up.Executions("truncated-1"); n != 1 {
		t.Errorf("truncated-1 executed %d times, want 1", n)
	}
	poll.Until(t, "the loss is counted", func() bool { return dataLost(t, sc.Admin) == 1 })
	if !strings.Contains(sc.Logs(), "the store lost its data") {
		t.Errorf("no log line says the store lost its data:\n%s", sc.Logs())
	}
}
