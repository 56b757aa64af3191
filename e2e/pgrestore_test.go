package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// The restores a running sidecar must see (issue 78, item 1): each put an
// older copy of the records under a running sidecar, and v0.8.0 executed
// the retry of a payment acknowledged after the copy was taken a second
// time, where docs/production.md promises 412 record-lost. The sidecar
// remembers the records' watermark (a counter every look at the epoch
// raises, idem_epoch); one below it is a loss.

// lossCase is one way of putting an older copy of the records in place:
// taken after the first payment, put back after the second.
type lossCase struct {
	// url is the sidecar's store.postgres.url on pg; "" is pg's own.
	url func(t *testing.T, pg *pgtest.Server) string
	// take copies the records as they are; restore puts the copy back.
	take    func(t *testing.T, pg *pgtest.Server) any
	restore func(t *testing.T, pg *pgtest.Server, copy any)
	// why is in the log line that says why the store lost its data.
	why string
}

// runLoss runs c: a payment kept by the copy replays, the one after it
// is refused 412 record-lost (executed once), a new one executes, and the
// loss is counted and logged.
func runLoss(t *testing.T, pg *pgtest.Server, c lossCase) {
	t.Helper()
	url := pg.URL
	if c.url != nil {
		url = c.url(t, pg)
	}
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, url, "    create_schema: false\n"))
	sent := time.Now().Add(-2 * time.Second)
	client := &http.Client{Timeout: 20 * time.Second}
	pay := func(key string, firstSent time.Time) (int, string) {
		t.Helper()
		req := binarytest.PayRequest(sc.Client+"/payments", key, `{"amount":1}`)
		req.Header.Set("X-Forwarded-User", "alice")
		req.Header.Set("Repeatability-First-Sent", firstSent.UTC().Format(http.TimeFormat))
		resp, err := client.Do(req)
		if err != nil {
			sc.Signal(syscall.SIGQUIT)
			time.Sleep(time.Second)
			t.Fatalf("%s: %v\n%s", key, err, sc.Logs())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	st, kept := pay("kept-1", sent)
	if st != http.StatusCreated {
		t.Fatalf("first attempt: %d %s\n%s", st, kept, sc.Logs())
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch
	copied := c.take(t, pg)
	time.Sleep(1500 * time.Millisecond) // and again, past the copy
	if st, body := pay("lost-1", sent); st != http.StatusCreated {
		t.Fatalf("the payment after the copy: %d %s", st, body)
	}
	time.Sleep(1500 * time.Millisecond) // a look after it: the watermark it raised goes with the copy
	c.restore(t, pg, copied)

	var body string
	poll.Until(t, "the retry is answered after the restore", func() bool {
		st, body = pay("lost-1", sent)
		return st != http.StatusServiceUnavailable
	})
	if st != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
		t.Errorf("the retry of a payment the restore took away: %d %s, want 412 record-lost\n%s", st, body, sc.Logs())
	}
	if n := up.Executions("lost-1"); n != 1 {
		t.Errorf("lost-1 executed %d times, want 1", n)
	}
	if st, body := pay("kept-1", sent); st != http.StatusCreated || body != kept {
		t.Errorf("the retry of a payment the copy kept: %d %q, want its first answer %q", st, body, kept)
	}
	if st, body := pay("after-1", time.Now()); st != http.StatusCreated {
		t.Errorf("a request first sent after the restore: %d %s, want 201", st, body)
	}
	poll.Until(t, "the loss is counted", func() bool { return dataLost(t, sc.Admin) >= 1 })
	if !strings.Contains(sc.Logs(), c.why) {
		t.Errorf("no log line says %q:\n%s", c.why, sc.Logs())
	}
}

// migrated installs the schema on pg as its owner (what store migrate
// does before the sidecars start with create_schema: false), and grants
// role the runtime rights when set.
func migrated(t *testing.T, pg *pgtest.Server, role string) {
	t.Helper()
	dir := t.TempDir()
	cfg := dir + "/migrate.yaml"
	writeFile(t, cfg, pgConfig("http://127.0.0.1:1", pg.URL, ""))
	args := []string{"store", "migrate", "-config", cfg}
	if role != "" {
		args = append(args, "-grant", role)
	}
	if out, err := exec.Command(binarytest.TestBinary(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("store migrate: %v\n%s", err, out)
	}
}

// TestPostgresRestoredBaseBackupIsALoss: a base backup restored as it was
// taken, with no recovery signal (the same cluster, the same timeline).
func TestPostgresRestoredBaseBackupIsALoss(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	migrated(t, pg, "")
	runLoss(t, pg, lossCase{
		take:    func(t *testing.T, pg *pgtest.Server) any { return pg.BaseBackup(t) },
		restore: func(t *testing.T, pg *pgtest.Server, copy any) { pg.RestoreBackup(t, copy.(string)) },
		why:     "the records went back",
	})
}

// tableCopy is the records table as COPY wrote it.
type tableCopy struct{ records, markers []byte }

// copyOut is COPY TO of the idemproxy schema's records (and markers,
// when both).
func copyOut(t *testing.T, pg *pgtest.Server, both bool) any {
	t.Helper()
	c := pg.Conn(t)
	var out tableCopy
	for _, tbl := range []struct {
		name string
		dst  *[]byte
	}{{"records", &out.records}, {"markers", &out.markers}} {
		if tbl.name == "markers" && !both {
			break
		}
		var b bytes.Buffer
		if _, err := c.PgConn().CopyTo(context.Background(), &b, "COPY idemproxy."+tbl.name+" TO STDOUT"); err != nil {
			t.Fatal(err)
		}
		*tbl.dst = b.Bytes()
	}
	return out
}

// copyIn empties the tables and loads the copy, in one transaction (as
// psql -1 runs a table's dump).
func copyIn(t *testing.T, pg *pgtest.Server, copy any) {
	t.Helper()
	in := copy.(tableCopy)
	ctx := context.Background()
	c := pg.Conn(t)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"records": in.records, "markers": in.markers} {
		if data == nil {
			continue
		}
		if _, err := tx.Exec(ctx, "TRUNCATE idemproxy."+name); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), "COPY idemproxy."+name+" FROM STDIN"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPostgresRestoredTableIsALoss: the records table alone restored from
// a dump, in one transaction (its marker row comes back with it).
func TestPostgresRestoredTableIsALoss(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	migrated(t, pg, "")
	runLoss(t, pg, lossCase{
		take:    func(t *testing.T, pg *pgtest.Server) any { return copyOut(t, pg, false) },
		restore: copyIn,
		why:     "the records went back",
	})
}

// TestPostgresResetWALIsALoss: pg_resetwal after a crash: what was
// committed since the last checkpoint and not written to the data files
// (the background writer kept from writing it) is gone.
func TestPostgresResetWALIsALoss(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t, "bgwriter_lru_maxpages", "0", "checkpoint_timeout", "1h")
	migrated(t, pg, "")
	runLoss(t, pg, lossCase{
		take: func(t *testing.T, pg *pgtest.Server) any {
			if _, err := pg.Conn(t).Exec(context.Background(), "CHECKPOINT"); err != nil {
				t.Fatal(err)
			}
			return nil
		},
		restore: func(t *testing.T, pg *pgtest.Server, _ any) { pg.ResetWAL(t) },
		why:     "the records went back",
	})
}

// TestPostgresNewClusterWithoutControlDataIsALoss: a restore into a new
// cluster (another system identifier) whose runtime role may not read
// pg_control_system, so that the identifier cannot tell: the records'
// watermark does.
func TestPostgresNewClusterWithoutControlDataIsALoss(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	setup := func(pg *pgtest.Server) {
		c := pg.Conn(t)
		for _, q := range []string{"CREATE ROLE app LOGIN", "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_control_system() FROM PUBLIC"} {
			if _, err := c.Exec(context.Background(), q); err != nil {
				t.Fatal(err)
			}
		}
		migrated(t, pg, "app")
	}
	setup(pg)
	runLoss(t, pg, lossCase{
		url: func(t *testing.T, pg *pgtest.Server) string {
			return strings.Replace(pg.URL, "postgres://"+pgtest.User+"@", "postgres://app@", 1)
		},
		take: func(t *testing.T, pg *pgtest.Server) any { return copyOut(t, pg, true) },
		restore: func(t *testing.T, pg *pgtest.Server, copy any) {
			pg.Reinit(t)
			setup(pg)
			copyIn(t, pg, copy)
		},
		why: "the records went back",
	})
}

// TestPostgresAsyncPromotionBesideASyncStandbyIsALoss: a primary with a
// synchronous standby and an asynchronous one; the asynchronous one,
// which never got the second payment, is promoted. The cluster had a
// synchronous standby, but the promoted server was not it: v0.8.0 took
// the new timeline for a synchronous failover (its flag was the
// cluster's) and executed the retry again.
func TestPostgresAsyncPromotionBesideASyncStandbyIsALoss(t *testing.T) {
	t.Parallel()
	primary := pgtest.Start(t)
	migrated(t, primary, "")
	syncStandby := primary.Standby(t)
	primary.Sync(t)
	async := primary.StandbyNamed(t, "async")
	runLoss(t, primary, lossCase{
		url: func(t *testing.T, pg *pgtest.Server) string {
			return fmt.Sprintf("postgres://%s@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write", pgtest.User, primary.Addr, async.Addr)
		},
		take: func(t *testing.T, pg *pgtest.Server) any {
			// Everything so far reached the asynchronous standby; then
			// it is cut off. The synchronous one goes on.
			ctx := context.Background()
			pc, ac := primary.Conn(t), async.Conn(t)
			var lsn string
			if err := pc.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
				t.Fatal(err)
			}
			poll.Until(t, "the asynchronous standby replayed the primary's WAL", func() bool {
				var caught bool
				err := ac.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&caught)
				return err == nil && caught
			})
			// Its configuration came from the primary, synchronous
			// standby and all: once promoted it waits for none.
			for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()"} {
				if _, err := ac.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			poll.Until(t, "the asynchronous standby stopped streaming", func() bool {
				var n int
				err := pc.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'async'").Scan(&n)
				return err == nil && n == 0
			})
			return nil
		},
		restore: func(t *testing.T, pg *pgtest.Server, _ any) {
			primary.Kill()
			syncStandby.Stop() // the sidecar's URL names the primary and the asynchronous one
			async.Promote(t)
		},
		why: "timeline changed",
	})
}

// writeFile writes text to path, failing t.
func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStoreNewEpoch (issue 78, item 1): a restore while every sidecar was
// stopped leaves nothing to compare with; idemproxy store new-epoch, run
// before the sidecars start, begins a new epoch after a loss by hand, on
// either store: a request first sent before it, whose record the restore
// took away, gets 412 record-lost; a record the store kept still
// replays; a request first sent after it executes; the sidecar counts the
// loss.
func TestStoreNewEpoch(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"postgres", "redis"} {
		t.Run(store, func(t *testing.T) {
			up := binarytest.NewRecorder(t)
			var cfg string
			if store == "postgres" {
				cfg = pgConfig(up.URL, pgtest.Start(t).URL, "")
			} else {
				cfg = payConfig(up.URL, redistest.Start(t).Addr, "")
			}
			path := t.TempDir() + "/config.yaml"
			writeFile(t, path, cfg)
			sent := time.Now().Add(-5 * time.Second)
			sc := startBinary(t, cfg)
			st, kept := postFirstSent(t, sc.Client+"/payments", "kept-1", sent)
			if st != http.StatusCreated {
				t.Fatalf("first attempt: %d %s", st, kept)
			}
			if err := sc.Stop(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(binarytest.TestBinary(t), "store", "new-epoch", "-config", path).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "a new epoch after a loss began") {
				t.Fatalf("store new-epoch: %v\n%s", err, out)
			}
			sc = startBinary(t, cfg)
			if st, body := postFirstSent(t, sc.Client+"/payments", "lost-1", sent); st != http.StatusPreconditionFailed || !strings.Contains(body, "record-lost") {
				t.Errorf("a request first sent before the new epoch, its record gone: %d %s, want 412 record-lost", st, body)
			}
			if st, body := postFirstSent(t, sc.Client+"/payments", "kept-1", sent); st != http.StatusCreated || body != kept {
				t.Errorf("the retry of a record the store kept: %d %q, want %q replayed", st, body, kept)
			}
			if st, body := postFirstSent(t, sc.Client+"/payments", "after-1", time.Now()); st != http.StatusCreated {
				t.Errorf("a request first sent after the new epoch: %d %s, want 201", st, body)
			}
			if n := up.Executions("lost-1"); n != 0 {
				t.Errorf("lost-1 executed %d times, want 0", n)
			}
		})
	}
}
