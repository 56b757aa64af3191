package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestPostgresLeastPrivilege (issue 62): the two roles docs/production.md
// gives. An owner role migrates (idemproxy store migrate -grant app) and a
// runtime role that owns nothing runs the sidecar (create_schema: false):
// it serves, replays, and can replace nothing. The functions run with a
// fixed search_path and PUBLIC may not execute them. A schema another role
// owns is refused, naming that role, by store migrate and by a sidecar
// with create_schema: true. v0.7.0 installed into any schema and left its
// functions executable by PUBLIC.
func TestPostgresLeastPrivilege(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	ctx := context.Background()
	admin := pg.Conn(t)
	for _, q := range []string{
		"CREATE ROLE owner LOGIN", "GRANT CREATE ON DATABASE postgres TO owner",
		"CREATE ROLE app LOGIN",
		"CREATE ROLE mallory LOGIN", "CREATE SCHEMA theirs AUTHORIZATION mallory",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	up := binarytest.NewRecorder(t)
	as := func(role, extra string) string {
		return pgConfig(up.URL, fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", role, pg.Addr), extra)
	}
	dir := t.TempDir()
	write := func(name, body string) string { return writeIn(t, dir, name, body) }
	bin := binarytest.TestBinary(t)

	out, err := exec.Command(bin, "store", "migrate", "-config", write("owner.yaml", as("owner", "")), "-grant", "app").CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("version %d of the functions", pgstore.SchemaVersion)) || !strings.Contains(string(out), `role "app" may use schema "idemproxy"`) {
		t.Fatalf("store migrate -grant app as the owner: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "store", "migrate", "-config", write("theirs.yaml", as("owner", "    schema: theirs\n"))).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `schema "theirs" belongs to role "mallory"`) {
		t.Errorf("store migrate into a schema mallory owns: %v\n%s\nwant exit 1 naming mallory", err, out)
	}

	sc := startBinary(t, as("app", "    create_schema: false\n"))
	st, first := post(t, sc.Client+"/payments", "least-1", `{}`)
	if st != http.StatusCreated {
		t.Fatalf("first attempt as the runtime role: %d %s", st, first)
	}
	if resp, again := postAnswer(t, sc.Client+"/payments", "least-1", `{}`); resp.StatusCode != http.StatusCreated || again != first || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry as the runtime role: %d %s, want the first answer replayed", resp.StatusCode, again)
	}
	var owned, public, unpinned int
	if err := admin.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pg_class WHERE relowner = 'app'::regrole) + (SELECT count(*) FROM pg_proc WHERE proowner = 'app'::regrole) + (SELECT count(*) FROM pg_namespace WHERE nspowner = 'app'::regrole),
		(SELECT count(*) FROM pg_proc WHERE pronamespace = 'idemproxy'::regnamespace AND proname LIKE '`+pgstore.FunctionPattern()+`' AND has_function_privilege('mallory', oid, 'EXECUTE')),
		(SELECT count(*) FROM pg_proc WHERE pronamespace = 'idemproxy'::regnamespace AND proname LIKE '`+pgstore.FunctionPattern()+`' AND NOT coalesce(proconfig, '{}') @> ARRAY['search_path=pg_catalog, pg_temp'])`).Scan(&owned, &public, &unpinned); err != nil {
		t.Fatal(err)
	}
	if owned != 0 || public != 0 || unpinned != 0 {
		t.Errorf("the runtime role owns %d objects, another role may execute %d functions, %d functions have no fixed search_path; want 0, 0, 0", owned, public, unpinned)
	}

	// create_schema: true as the runtime role, on the schema its owner
	// migrated: nothing is installed into another role's schema, and the
	// sidecar serves on the owner's functions (v0.8.0 never became
	// schema-ready: issue 79).
	runtime := startBinary(t, as("app", ""))
	poll.Until(t, "the sidecar says it serves on the owner's schema", func() bool {
		return strings.Contains(runtime.Logs(), "the schema belongs to another role, which installed this release's functions") && strings.Contains(runtime.Logs(), "owner")
	})
	if st, body := post(t, runtime.Client+"/payments", "least-2", `{}`); st != http.StatusCreated {
		t.Errorf("create_schema: true as the runtime role: %d %s", st, body)
	}
	// mallory's schema, which has no functions: never used, and said so.
	theirs := binarytest.T(t, as("app", "    schema: theirs\n"), binarytest.Options{Live: true})
	poll.Until(t, "the sidecar on mallory's schema says why it does not serve", func() bool {
		return strings.Contains(theirs.Logs(), `belongs to role \"mallory\"`) || strings.Contains(theirs.Logs(), `belongs to role "mallory"`)
	})
	if st, body := get(t, theirs.Admin+"/readyz"); st != http.StatusServiceUnavailable {
		t.Errorf("/readyz on a schema it cannot use: %d %s, want 503", st, body)
	}
}

// TestPostgresSchemaAtStart (issue 64): four sidecars starting together
// on an empty database (create_schema: true) install the schema once
// between them (an advisory lock serializes the installs): each is ready
// (idemproxy_store_schema_ready 1) and serves. A sidecar that may not
// install it (create_schema: false) on a database without it says so in
// one line naming store migrate, shows schema_ready 0, and serves once
// an operator migrates (it retries with backoff).
func TestPostgresSchemaAtStart(t *testing.T) {
	t.Parallel()
	binarytest.TestBinary(t) // skips here, not in the goroutines below, where it cannot
	up := binarytest.NewRecorder(t)
	t.Run("four at once", func(t *testing.T) {
		pg := pgtest.Start(t)
		cfg := pgConfig(up.URL, pg.URL, "")
		scs := make([]*sidecar, 4)
		var wg sync.WaitGroup
		for i := range scs {
			wg.Go(func() { scs[i] = startBinary(t, cfg) })
		}
		wg.Wait()
		for i, sc := range scs {
			poll.Until(t, fmt.Sprintf("sidecar %d ready", i), func() bool { return metric(t, sc.Admin, "idemproxy_store_schema_ready 1") })
			if st, body := post(t, sc.Client+"/payments", fmt.Sprintf("four-%d", i), `{}`); st != http.StatusCreated {
				t.Errorf("sidecar %d: %d %s", i, st, body)
			}
			if strings.Contains(sc.Logs(), "store not ready") {
				t.Errorf("sidecar %d could not install the schema:\n%s", i, sc.Logs())
			}
		}
	})
	t.Run("not migrated", func(t *testing.T) {
		pg := pgtest.Start(t)
		path := filepath.Join(t.TempDir(), "pg.yaml")
		if err := os.WriteFile(path, []byte(pgConfig(up.URL, pg.URL, "")), 0o600); err != nil {
			t.Fatal(err)
		}
		sc := binarytest.T(t, pgConfig(up.URL, pg.URL, "    create_schema: false\n"), binarytest.Options{Live: true})
		poll.Until(t, "the sidecar says the schema is missing", func() bool { return strings.Contains(sc.Logs(), "run idemproxy store migrate") })
		if !metric(t, sc.Admin, "idemproxy_store_schema_ready 0") {
			t.Errorf("schema_ready is not 0 before the migration:\n%s", grepLines(scrape(t, sc.Admin), "schema_ready"))
		}
		// Not ready until the schema is there (issue 79: v0.8.0 was ready,
		// and a rollout of such pods answered every protected request 503).
		if st, body := get(t, sc.Admin+"/readyz"); st != http.StatusServiceUnavailable || !strings.Contains(body, "schema") {
			t.Errorf("/readyz before the migration: %d %s, want 503 naming the schema", st, body)
		}
		for _, line := range strings.Split(sc.Logs(), "\n") {
			if strings.Contains(line, "CREATE TABLE") || strings.Contains(line, "CREATE OR REPLACE") {
				t.Fatalf("a log line carries the schema's text: %.200s", line)
			}
		}
		if out, err := exec.Command(binarytest.TestBinary(t), "store", "migrate", "-config", path).CombinedOutput(); err != nil {
			t.Fatalf("store migrate: %v\n%s", err, out)
		}
		poll.Until(t, "the sidecar finds the schema", func() bool { return metric(t, sc.Admin, "idemproxy_store_schema_ready 1") })
		if st, body := get(t, sc.Admin+"/readyz"); st != http.StatusOK {
			t.Errorf("/readyz after the migration: %d %s, want 200\n%s\n%s", st, body, grepLines(scrape(t, sc.Admin), "schema_ready"), sc.Logs())
		}
		if st, body := post(t, sc.Client+"/payments", "migrated-1", `{}`); st != http.StatusCreated {
			t.Errorf("after the migration: %d %s", st, body)
		}
	})
	// A role that may not create the schema, with create_schema: true, on
	// a database without it: told in one line, and the schema's text never
	// reaches the server, whose log held all of it for every try
	// (issue 79: 3,255 lines in 40 s).
	t.Run("may not create", func(t *testing.T) {
		pg := pgtest.Start(t)
		if _, err := pg.Conn(t).Exec(context.Background(), "CREATE ROLE app LOGIN; REVOKE CREATE ON DATABASE postgres FROM PUBLIC; REVOKE CREATE ON SCHEMA public FROM PUBLIC"); err != nil {
			t.Fatal(err)
		}
		sc := binarytest.T(t, pgConfig(up.URL, fmt.Sprintf("postgres://app@%s/postgres?sslmode=disable", pg.Addr), ""), binarytest.Options{Live: true})
		poll.Until(t, "the sidecar says it may not create the schema", func() bool {
			return strings.Contains(sc.Logs(), `may not create it (no CREATE on the database)`)
		})
		if st, _ := get(t, sc.Admin+"/readyz"); st != http.StatusServiceUnavailable {
			t.Errorf("/readyz: %d, want 503", st)
		}
		if logs := pg.Logs(); strings.Contains(logs, "CREATE TABLE") || strings.Contains(logs, "CREATE OR REPLACE FUNCTION") || strings.Contains(logs, "plpgsql") {
			t.Errorf("the server's log holds the schema's text:\n%.2000s", logs)
		}
	})
}

// TestPostgresConnectionsShowThemselves (issue 64): the sidecar's
// connections say whose they are in pg_stat_activity (application_name
// idemproxy/<version>), its pool is on /metrics (connections by state,
// acquire waits and their time), and -check warns when the URL lets the
// connection fall back to plaintext off loopback (pgx's default sslmode
// is prefer).
func TestPostgresConnectionsShowThemselves(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, pg.URL, ""))
	if st, body := post(t, sc.Client+"/payments", "named-1", `{}`); st != http.StatusCreated {
		t.Fatalf("%d %s", st, body)
	}
	var named int
	if err := pg.Conn(t).QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'idemproxy/v%'").Scan(&named); err != nil || named == 0 {
		t.Errorf("%d connections named idemproxy/<version> in pg_stat_activity (%v), want the sidecar's", named, err)
	}
	for _, family := range []string{`idemproxy_store_pool_connections{state="acquired"}`, `idemproxy_store_pool_connections{state="idle"}`, "idemproxy_store_pool_acquire_waits_total", "idemproxy_store_pool_acquire_wait_seconds_total"} {
		if !metric(t, sc.Admin, family) {
			t.Errorf("/metrics lacks %s", family)
		}
	}
	path := filepath.Join(t.TempDir(), "remote.yaml")
	if err := os.WriteFile(path, []byte(pgConfig(up.URL, "postgres://idemproxy@db.internal:5432/app", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binarytest.TestBinary(t), "-config", path, "-check").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "store.postgres.url: its sslmode lets the connection be plaintext") {
		t.Errorf("-check of a URL without sslmode off loopback: %v\n%s\nwant a warning naming sslmode", err, out)
	}
}
