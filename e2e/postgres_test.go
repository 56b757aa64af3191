package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// pgConfig is a pay route on the PostgreSQL store at url.
func pgConfig(upstream, url, extra string) string {
	return fmt.Sprintf("upstream:\n  url: %q\nstore:\n  postgres:\n    url: %q\n%sroutes:\n  - name: pay\n    match: \"POST /payments\"\n", upstream, url, extra)
}

// TestPostgresStoreThroughTheBinary (issue 56): a sidecar configured with
// store.postgres (the schema installed at start, create_schema's
// default) replays a retry byte for byte and executes a key once under
// concurrent retries; its records outlive the sidecar (a new one replays
// them) and PostgreSQL itself (killed with -9 and restarted: every
// acknowledged record is there).
func TestPostgresStoreThroughTheBinary(t *testing.T) {
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, pg.URL, ""))

	st, first := post(t, sc.Client+"/payments", "pg-1", `{"amount":1}`)
	if st != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", st, first)
	}
	resp, again := postAnswer(t, sc.Client+"/payments", "pg-1", `{"amount":1}`)
	if resp.StatusCode != http.StatusCreated || again != first || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %q replayed=%q, want the first answer replayed", resp.StatusCode, again, resp.Header.Get("Idempotent-Replayed"))
	}
	if st, body := post(t, sc.Client+"/payments", "pg-1", `{"amount":2}`); st != http.StatusUnprocessableEntity {
		t.Errorf("the key with another body: %d %s, want 422", st, body)
	}

	up.Delay = 300 * time.Millisecond
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { post(t, sc.Client+"/payments", "pg-concurrent", `{}`) })
	}
	wg.Wait()
	up.Delay = 0
	if n := up.Executions("pg-concurrent"); n != 1 {
		t.Errorf("8 concurrent attempts executed %d times, want 1", n)
	}

	sc.Kill()
	pg.Kill()
	pg.Restart()
	other := startBinary(t, pgConfig(up.URL, pg.URL, "    create_schema: false\n"))
	poll.Until(t, "the new sidecar's store up", func() bool { seen, upNow := storeUp(t, other.Admin); return seen && upNow })
	if st, body := post(t, other.Client+"/payments", "pg-1", `{"amount":1}`); st != http.StatusCreated || body != first {
		t.Errorf("after the sidecar and PostgreSQL were killed: %d %q, want the first answer", st, body)
	}
	if n := up.Executions("pg-1"); n != 1 {
		t.Errorf("pg-1 executed %d times, want 1", n)
	}
}

// TestPostgresPasswordOverrides (issue 79): the role's password from the
// environment, as for Redis: IDEMPROXY_STORE_POSTGRES_PASSWORD (a Secret
// as an env var) or IDEMPROXY_STORE_POSTGRES_PASSWORD_FILE, against a
// server that asks for it; a wrong one is not ready and says why.
func TestPostgresPasswordOverrides(t *testing.T) {
	t.Parallel()
	binarytest.TestBinary(t)
	pg := pgtest.Start(t)
	pg.RequirePassword(t, "app", "s3cret")
	if _, err := pg.Conn(t).Exec(context.Background(), "GRANT CREATE ON DATABASE postgres TO app"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := binarytest.NewRecorder(t)
	cfg := pgConfig(up.URL, fmt.Sprintf("postgres://app@%s/postgres?sslmode=disable", pg.Addr), "")
	for i, env := range []string{"IDEMPROXY_STORE_POSTGRES_PASSWORD=s3cret", "IDEMPROXY_STORE_POSTGRES_PASSWORD_FILE=" + file} {
		sc := binarytest.T(t, cfg, binarytest.Options{Env: []string{env}})
		if st, body := post(t, sc.Client+"/payments", fmt.Sprintf("env-%d", i), `{}`); st != http.StatusCreated {
			t.Errorf("%s: %d %s", env, st, body)
		}
	}
	sc := binarytest.T(t, cfg, binarytest.Options{Env: []string{"IDEMPROXY_STORE_POSTGRES_PASSWORD=wrong"}, Live: true})
	poll.Until(t, "the sidecar says the store is not ready", func() bool { return strings.Contains(sc.Logs(), "store not ready at start") })
	if !strings.Contains(sc.Logs(), "password authentication failed") || strings.Contains(sc.Logs(), "wrong") {
		t.Errorf("a wrong password: the log should say so, without the password:\n%s", sc.Logs())
	}
	if st, _ := get(t, sc.Admin+"/readyz"); st != http.StatusServiceUnavailable {
		t.Errorf("/readyz with a wrong password: %d, want 503", st)
	}
}

// TestPostgresConfigRefused: a password in store.postgres.url, both
// stores at once, a schema that is not a plain name and a password file
// that cannot be read are refused at -check with a message naming the
// key, and store migrate installs the schema.
func TestPostgresConfigRefused(t *testing.T) {
	bin := binarytest.TestBinary(t)
	dir := t.TempDir()
	notPEM, ca := filepath.Join(dir, "not.pem"), filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, selfSignedPEM(t), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, store, want string }{
		{"password in the URL", "  postgres:\n    url: \"postgres://u:secret@127.0.0.1:5432/db\"\n", "store.postgres.url: holds a password: put it in a file named by store.postgres.password_file"},
		{"password in the URL's query", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db?sslmode=disable&password=secret\"\n", "store.postgres.url: holds a password: put it in a file named by store.postgres.password_file"},
		{"sslmode typo", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db?sslmode=requre\"\n", "store.postgres.url: the driver cannot use it: sslmode is invalid"},
		{"bad port", "  postgres:\n    url: \"postgres://u@127.0.0.1:99999/db\"\n", "store.postgres.url: the driver cannot use it: invalid port"},
		{"bad scheme", "  postgres:\n    url: \"postgresx://u@127.0.0.1:5432/db\"\n", "store.postgres.url: the driver takes postgres:// or postgresql:// URLs"},
		{"password in listen_url", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db\"\n    listen_url: \"postgres://u:secret@127.0.0.1:5432/db\"\n", "store.postgres.listen_url: holds a password"},
		// Forms v0.8.0's -check let through (issue 78, item 6).
		{"password in a multi-host URL whose last host has no port", "  postgres:\n    url: \"postgres://u:secret@db-1:5432,db-2/db?target_session_attrs=read-write\"\n", "store.postgres.url: holds a password"},
		{"password setting with a space before =", "  postgres:\n    url: \"host=127.0.0.1 user=u password =secret dbname=db\"\n", "store.postgres.url: holds a password"},
		{"password setting with a tab around =", "  postgres:\n    url: \"host=127.0.0.1 user=u password\\t= secret dbname=db\"\n", "store.postgres.url: holds a password"},
		{"both stores", "  redis:\n    addrs: [\"127.0.0.1:6379\"]\n  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db\"\n", "set either store.redis.addrs or store.postgres.url, not both"},
		{"schema", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db\"\n    schema: \"a;b\"\n", "store.postgres.schema: must be a plain SQL name"},
		{"password file missing", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db\"\n    password_file: \"/nonexistent/pg-password\"\n", "store.postgres.password_file: open /nonexistent/pg-password"},
		{"password and password_file", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db\"\n    password: secret\n    password_file: \"/nonexistent/pg-password\"\n", "store.postgres.password: set together with store.postgres.password_file: keep one"},
		// The TLS files a URL names are read by -check (issue 79: v0.8.0's
		// -check passed a missing sslrootcert, then the sidecar exited 1
		// at start).
		{"sslrootcert missing", "  postgres:\n    url: \"postgres://u@db:5432/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem\"\n", "store.postgres.url: the TLS files it names (sslrootcert, sslcert, sslkey) cannot be used: unable to read CA file: open /nonexistent/ca.pem"},
		{"sslrootcert not PEM", "  postgres:\n    url: \"postgres://u@db:5432/db?sslmode=verify-full&sslrootcert=" + notPEM + "\"\n", "unable to add CA to cert pool"},
		{"sslkey missing", "  postgres:\n    url: \"postgres://u@db:5432/db?sslmode=verify-full&sslrootcert=" + ca + "&sslcert=" + ca + "&sslkey=/nonexistent/client.key\"\n", "store.postgres.url: the TLS files it names (sslrootcert, sslcert, sslkey) cannot be used"},
		{"listen_url's sslrootcert missing", "  postgres:\n    url: \"postgres://u@127.0.0.1:5432/db\"\n    listen_url: \"postgres://u@db:5432/db?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem\"\n", "store.postgres.listen_url: the TLS files it names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
			if err := os.WriteFile(path, []byte("upstream:\n  url: \"http://127.0.0.1:9\"\nstore:\n"+tc.store+"routes:\n  - name: pay\n    match: \"POST /p\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "-config", path, "-check").CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "panic") {
				t.Errorf("-check: %v\n%s\nwant exit 1 naming %q", err, out, tc.want)
			}
			if strings.Contains(string(out), "secret") {
				t.Errorf("-check echoed the password:\n%s", out)
			}
		})
	}
	// sslmode=require encrypts but verifies nothing: valid, with a warning
	// naming the key; -skip-files does not read the TLS files;
	// claim_memory_limit (Redis' maxmemory) with PostgreSQL: a warning.
	for _, tc := range []struct{ name, url, extra, flag, want string }{
		{"sslmode=require", "postgres://u@db:5432/db?sslmode=require", "", "", "store.postgres.url: sslmode=require encrypts the connection but checks nothing of the server's certificate"},
		{"sslrootcert missing, -skip-files", "postgres://u@db:5432/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", "", "-skip-files", "were not read"},
		{"claim_memory_limit", "postgres://u@127.0.0.1:5432/db", "  claim_memory_limit: 80%\n", "", "store.claim_memory_limit: 80% does nothing with store.postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.NewReplacer(" ", "_", ",", "", "=", "_").Replace(tc.name)+".yaml")
			if err := os.WriteFile(path, []byte(pgConfig("http://127.0.0.1:9", tc.url, tc.extra)), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"-config", path, "-check"}
			if tc.flag != "" {
				args = append(args, tc.flag)
			}
			out, err := exec.Command(bin, args...).CombinedOutput()
			if err != nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("-check: %v\n%s\nwant exit 0 and %q", err, out, tc.want)
			}
		})
	}
	t.Run("store migrate", func(t *testing.T) {
		pg := pgtest.Start(t)
		path := filepath.Join(dir, "migrate.yaml")
		if err := os.WriteFile(path, []byte(pgConfig("http://127.0.0.1:9", pg.URL, "    schema: idem_test\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		for range 2 { // a second run changes nothing
			out, err := exec.Command(bin, "store", "migrate", "-config", path).CombinedOutput()
			if err != nil || !strings.Contains(string(out), `schema "idem_test" installed`) {
				t.Fatalf("store migrate: %v\n%s", err, out)
			}
		}
	})
}

// TestPostgresFailoverLosesNothing (issue 56; issue 62): a primary with a
// synchronous standby, the sidecar's URL naming both with
// target_session_attrs=read-write. Every answer the sidecar gave was
// committed on both; the primary is killed with -9 and the standby
// promoted: every key replays its first answer, none executes again, and
// the new timeline is no loss: a request first sent before the failover
// and never answered executes (no 412), nothing is counted lost.
func TestPostgresFailoverLosesNothing(t *testing.T) {
	primary := pgtest.Start(t)
	standby := primary.Standby(t)
	primary.Sync(t)
	url := fmt.Sprintf("postgres://%s@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write", pgtest.User, primary.Addr, standby.Addr)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, url, ""))
	answers := map[string]string{}
	for i := range 20 {
		key := fmt.Sprintf("fo-%d", i)
		st, body := post(t, sc.Client+"/payments", key, `{}`)
		if st != http.StatusCreated {
			t.Fatalf("%s: %d %s", key, st, body)
		}
		answers[key] = body
	}
	sent := time.Now()
	time.Sleep(1500 * time.Millisecond) // the store watcher has looked at the epoch on the primary
	primary.Kill()
	standby.Promote(t)
	for key, want := range answers {
		var st int
		var body string
		// The pool finds the new primary once its connections to the
		// old one fail: a retry meanwhile is 503 store-unavailable.
		poll.Until(t, key+" answered after the failover", func() bool {
			st, body = post(t, sc.Client+"/payments", key, `{}`)
			return st != http.StatusServiceUnavailable
		})
		if st != http.StatusCreated || body != want {
			t.Errorf("%s after the failover: %d %q, want the first answer", key, st, body)
		}
		if n := up.Executions(key); n != 1 {
			t.Errorf("%s executed %d times, want 1", key, n)
		}
	}
	if st, body := postFirstSent(t, sc.Client+"/payments", "fo-first-sent", sent); st != http.StatusCreated {
		t.Errorf("a request first sent before a synchronous failover: %d %s, want 201 (nothing was lost)", st, body)
	}
	time.Sleep(1500 * time.Millisecond) // the store watcher looks again
	if lost := dataLost(t, sc.Admin); lost != 0 {
		t.Errorf("idemproxy_store_data_lost_total is %v after a synchronous failover, want 0", lost)
	}
}

// TestStoreCopyFromRedis (issue 56): a Redis fleet's settled records,
// copied into PostgreSQL by idemproxy store copy -from-redis, replay on a
// sidecar of the PostgreSQL store with their first answer, executed
// once; a second copy keeps what is there.
func TestStoreCopyFromRedis(t *testing.T) {
	rdb := redistest.Start(t)
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	dir := t.TempDir()
	oldCfg := filepath.Join(dir, "redis.yaml")
	newCfg := filepath.Join(dir, "postgres.yaml")
	if err := os.WriteFile(oldCfg, []byte(payConfig(up.URL, rdb.Addr, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newCfg, []byte(pgConfig(up.URL, pg.URL, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	old := startBinary(t, payConfig(up.URL, rdb.Addr, ""))
	answers := map[string]string{}
	for i := range 5 {
		key := fmt.Sprintf("moved-%d", i)
		st, body := post(t, old.Client+"/payments", key, `{}`)
		if st != http.StatusCreated {
			t.Fatalf("%s on Redis: %d %s", key, st, body)
		}
		answers[key] = body
	}
	old.Kill()
	bin := binarytest.TestBinary(t)
	for run := range 2 {
		out, err := exec.Command(bin, "store", "copy", "-from-redis", oldCfg, "-config", newCfg).CombinedOutput()
		want := "5 records copied from Redis with what is left of their retention (5 settled"
		if run == 1 {
			want = "0 records copied from Redis with what is left of their retention (0 settled, 0 orphaned claims a retry settles as outcome-unknown or reconciles, 0 streams whose owner died, as aborted), 5 kept"
		}
		if err != nil || !strings.Contains(string(out), want) {
			t.Fatalf("store copy (run %d): %v\n%s\nwant %q", run+1, err, out, want)
		}
	}
	sc := startBinary(t, pgConfig(up.URL, pg.URL, ""))
	for key, want := range answers {
		resp, body := postAnswer(t, sc.Client+"/payments", key, `{}`)
		if resp.StatusCode != http.StatusCreated || body != want || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s on PostgreSQL after the copy: %d %q, want the Redis fleet's answer replayed", key, resp.StatusCode, body)
		}
		if n := up.Executions(key); n != 1 {
			t.Errorf("%s executed %d times, want 1", key, n)
		}
	}
}

// TestPostgresMaxConnsThroughTheBinary: store.postgres.max_conns bounds
// the connections a running sidecar opens to PostgreSQL, the pool's and
// the one it listens for wake-ups on, under a burst of first attempts
// that would take more. The same burst with a larger bound opens more,
// so the bound is what held them.
func TestPostgresMaxConnsThroughTheBinary(t *testing.T) {
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	up.Delay = 200 * time.Millisecond
	ctx := context.Background()
	conn := pg.Conn(t)
	backends := func() int {
		var n int
		if err := conn.QueryRow(ctx, `select count(*) from pg_stat_activity
			where backend_type = 'client backend' and pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	peak := func(maxConns int) int {
		// Each operation on a connection of its own: group commit
		// (store.pipeline) holds a burst to two batches out, whatever
		// the bound, and the faster the functions the fewer connections
		// it ever opens.
		sc := startBinary(t, pgConfig(up.URL, pg.URL, fmt.Sprintf("    max_conns: %d\n  pipeline: false\n", maxConns)))
		defer func() {
			sc.Kill()
			poll.Until(t, "the killed sidecar's connections closed", func() bool { return backends() == 0 })
		}()
		var most atomic.Int64
		stop := make(chan struct{})
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			for {
				most.Store(max(most.Load(), int64(backends())))
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Go(func() {
				if st, body := post(t, sc.Client+"/payments", fmt.Sprintf("conns-%d-%d", maxConns, i), `{}`); st != http.StatusCreated {
					t.Errorf("max_conns %d, key %d: %d %s", maxConns, i, st, body)
				}
			})
		}
		wg.Wait()
		close(stop)
		<-watched
		return int(most.Load())
	}
	if got := peak(2); got > 3 {
		t.Errorf("max_conns: 2: the sidecar held %d connections at once, want at most 3 (the pool's 2 and the listener)", got)
	}
	if got := peak(12); got <= 3 {
		t.Errorf("max_conns: 12: the same burst held %d connections at most; it must take more than 3 for the bound of 2 to mean anything", got)
	}
}

// TestPostgresOutageQueuesNoCleanups: first attempts while PostgreSQL is
// down cannot get a connection, so their claims provably wrote nothing:
// each is answered 503 and leaves nothing to clean up. Before, the
// PostgreSQL store could not say so, and each queued a background
// cleanup, retried for its lease (idemproxy_unconfirmed_claims_total
// counted all 10 once PostgreSQL was back).
func TestPostgresOutageQueuesNoCleanups(t *testing.T) {
	const attempts = 10
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, pgConfig(up.URL, pg.URL, "defaults:\n  lease: 1s\n"))
	if st, body := post(t, sc.Client+"/payments", "before", `{}`); st != http.StatusCreated {
		t.Fatalf("before the outage: %d %s", st, body)
	}
	// The connections the sidecar holds when PostgreSQL goes away: a
	// claim that meets one of them may have been sent, nobody can tell,
	// so it is cleaned up. The claims after them dial, and cannot.
	var held int
	if err := pg.Conn(t).QueryRow(context.Background(), `select count(*) from pg_stat_activity
		where backend_type = 'client backend' and pid <> pg_backend_pid()`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	for i := range attempts {
		if st, body := post(t, sc.Client+"/payments", fmt.Sprint("down-", i), `{}`); st != http.StatusServiceUnavailable {
			t.Fatalf("while PostgreSQL is down: %d %s, want 503", st, body)
		}
	}
	pg.Restart()
	poll.Until(t, "a claim again", func() bool {
		st, _ := post(t, sc.Client+"/payments", "after", `{}`)
		return st == http.StatusCreated
	})
	time.Sleep(3 * time.Second) // three leases: a cleanup queued would have run, and been counted
	m := scrape(t, sc.Admin)
	cleaned := 0.0
	for _, result := range []string{"released", "not_found", "gave_up", "cleared_on_retry"} {
		cleaned += max(metricValue(t, m, `idemproxy_unconfirmed_claims_total{result="`+result+`"}`), 0)
	}
	// One more may have been dialled between the count and the stop.
	if most := min(held+1, attempts-1); cleaned > float64(most) {
		t.Errorf("%v of %d claims during the outage were cleaned up as unconfirmed, want at most the %d that could meet a connection held when it began:\n%s",
			cleaned, attempts, most, grepLines(m, "idemproxy_unconfirmed_claims_total"))
	}
	for i := range attempts {
		if n := up.Executions(fmt.Sprint("down-", i)); n != 0 {
			t.Errorf("down-%d executed %d times while PostgreSQL was down", i, n)
		}
	}
}

// selfSignedPEM is a self-signed certificate, PEM-encoded: a CA file the
// driver accepts.
func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
