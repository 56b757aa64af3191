package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestAnotherRolesAdvisoryLocksStopNothing (issue 78, item 2): any role
// that can connect may take any advisory lock, and v0.8.0 serialized its
// migration and its look at the epoch with advisory locks whose keys are
// known strings: a role holding them made every first attempt that says
// when it was first sent answer 503 after a second (6 of 6) and blocked
// store migrate (2 of 2). Through the binary, with another role holding
// both locks all along: store migrate installs the schema, and first-sent
// first attempts and their retries are answered as ever.
func TestAnotherRolesAdvisoryLocksStopNothing(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	ctx := context.Background()
	if _, err := pg.Conn(t).Exec(ctx, "CREATE ROLE mallory LOGIN"); err != nil {
		t.Fatal(err)
	}
	mallory, err := pgx.Connect(ctx, strings.Replace(pg.URL, "postgres://"+pgtest.User+"@", "postgres://mallory@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer mallory.Close(ctx)
	for _, key := range []string{"idemproxy migrate", "idem:epoch:server"} {
		if _, err := mallory.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", key); err != nil {
			t.Fatal(err)
		}
	}
	cfg := t.TempDir() + "/migrate.yaml"
	writeFile(t, cfg, pgConfig("http://127.0.0.1:1", pg.URL, ""))
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(mctx, binarytest.TestBinary(t), "store", "migrate", "-config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("store migrate, another role holding v0.8.0's advisory locks: %v\n%s", err, out)
	}
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, pg.URL, "    create_schema: false\n"))
	sent := time.Now().Add(-2 * time.Second)
	for i := range 6 {
		key := "locked-" + string(rune('a'+i))
		st, first := postFirstSent(t, sc.Client+"/payments", key, sent)
		if st != http.StatusCreated {
			t.Fatalf("first-sent first attempt %s: %d %s", key, st, first)
		}
		if st, again := postFirstSent(t, sc.Client+"/payments", key, sent); st != http.StatusCreated || again != first {
			t.Errorf("its retry: %d %s, want the first answer replayed", st, again)
		}
	}
	var held int
	if err := mallory.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted").Scan(&held); err != nil || held != 2 {
		t.Fatalf("mallory holds %d advisory locks (%v), want both all along", held, err)
	}
}
