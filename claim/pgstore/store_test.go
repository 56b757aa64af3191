package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/clockshim"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// deployment is a PostgreSQL server as the contract suite sees it: stores
// on one pool and schema, its values read and written with SQL.
type deployment struct {
	pool   *pgxpool.Pool
	schema string
	// rows stores streams' chunks as rows (record_format 5).
	rows bool
}

func (d deployment) Open(t *testing.T, prefix string, opts ...claim.Option) claim.Backend {
	if d.rows {
		opts = append([]claim.Option{claim.WithStreamRows(true)}, opts...)
	}
	s := pgstore.New(d.pool, d.schema, prefix, opts...)
	t.Cleanup(s.Close)
	return s
}

func (d deployment) table() string { return pgx.Identifier{d.schema, "records"}.Sanitize() }

func (d deployment) Raw(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	whole := pgx.Identifier{d.schema, "idem_v" + strconv.Itoa(pgstore.SchemaVersion) + "_whole"}.Sanitize()
	err := d.pool.QueryRow(ctx, "SELECT "+whole+"(key, value) FROM "+d.table()+" WHERE key = $1 AND expires_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)", key).Scan(&v)
	if err == pgx.ErrNoRows {
		return nil, nil
	}
	return v, err
}

func (d deployment) Plant(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	// value is the key's whole value: no chunk rows beside it.
	if _, err := d.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{d.schema, "chunks"}.Sanitize()+" WHERE key = $1", key); err != nil {
		return err
	}
	_, err := d.pool.Exec(ctx, "INSERT INTO "+d.table()+" (key, value, expires_ms) VALUES ($1, $2, floor(extract(epoch FROM clock_timestamp()) * 1000) + $3) "+
		"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_ms = EXCLUDED.expires_ms", key, value, ttl.Milliseconds())
	return err
}

func (d deployment) Lose(ctx context.Context, prefix string) error {
	for _, table := range []string{"records", "chunks"} {
		if _, err := d.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{d.schema, table}.Sanitize()+" WHERE left(key, length($1)) = $1", prefix); err != nil {
			return err
		}
	}
	_, err := d.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{d.schema, "markers"}.Sanitize()+" WHERE left(name, length($1)) = $1", prefix)
	return err
}

// open is a pool on a fresh server with the schema installed.
func open(t *testing.T) *pgxpool.Pool {
	t.Helper()
	srv := pgtest.Start(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL+"&pool_max_conns=64")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatalf("migrating again: %v", err)
	}
	return pool
}

// TestInstallsRaceOnAnEmptyDatabase (issue 78, item 2): pods starting
// together on an empty database each install the schema at once; the
// installers that lose the race to create it run again and wait on the
// versions table's lock (no advisory lock any role could take): every
// one succeeds.
func TestInstallsRaceOnAnEmptyDatabase(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	ctx := context.Background()
	errs := make(chan error, 6)
	for range cap(errs) {
		go func() {
			pool, err := pgxpool.New(ctx, srv.URL)
			if err != nil {
				errs <- err
				return
			}
			defer pool.Close()
			_, err = pgstore.Install(ctx, pool, "racing", "test")
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("an installer beside five others: %v", err)
		}
	}
}

// TestContract runs the shared contract suite (claim/contract) against a
// real PostgreSQL server.
func TestContract(t *testing.T) {
	t.Parallel() // on a server of its own
	contract.Run(t, deployment{pool: open(t), schema: "idemproxy"})
}

// TestContractStreamRows runs it with streams' chunks as rows
// (record_format 5).
func TestContractStreamRows(t *testing.T) {
	t.Parallel() // on a server of its own
	contract.Run(t, deployment{pool: open(t), schema: "idemproxy", rows: true})
}

// TestHealthReportsCleanup: Health reports the expired rows not deleted
// yet and how long ago the oldest expired, deletes them (the store
// watcher calls it every second), and reports the oldest claim in
// progress by its Created time; all by the indexes.
func TestHealthReportsCleanup(t *testing.T) {
	t.Parallel() // on a server of its own
	d := deployment{pool: open(t), schema: "idemproxy"}
	ctx := context.Background()
	s := d.Open(t, "cleanup:")
	// Measure the clocks first: a claim on unmeasured clocks has them
	// measured in the background, by a Health that would delete the
	// expired rows planted below before the one this test reads.
	s.Health(ctx)
	for i := range 3 {
		if err := d.Plant(ctx, fmt.Sprintf("cleanup:gone-%d", i), []byte("x"), -time.Duration(i+1)*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	rec := contract.NewRecord(t)
	rec.Created = time.Now().Add(-90 * time.Second)
	if _, err := s.Claim(ctx, s.Codec().Key("p", "r", "old"), rec, time.Hour, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	h := s.Health(ctx)[0]
	if h.Err != nil || h.Cleanup == nil || h.Cleanup.Expired != 3 || h.Cleanup.Lag < 3*time.Minute-time.Second || h.Cleanup.OldestClaim < 89*time.Second {
		t.Fatalf("health = %+v, cleanup %+v; want 3 expired, the oldest 3 minutes ago, a claim 90 s old", h, h.Cleanup)
	}
	if h = s.Health(ctx)[0]; h.Cleanup.Expired != 0 || h.Cleanup.Lag != 0 {
		t.Errorf("after a Health, cleanup %+v; want the expired rows deleted", h.Cleanup)
	}
}

// TestKeysCrossMidnight (issue 56): uniqueness holds for the whole
// retention whatever the date: on a database whose clock reads two
// seconds before midnight (a clock shim), a key completed and a key
// claimed before midnight are the same keys after it: the first replays,
// the second is still in progress, and neither can be claimed anew.
func TestKeysCrossMidnight(t *testing.T) {
	t.Parallel() // on a server of its own
	dir, err := os.MkdirTemp("", "idemproxy-midnight-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	clock, err := clockshim.Build(dir)
	if err != nil {
		t.Skipf("SKIP: %v", err)
	}
	// postgres runs as its own user: the shim and its offset file must be
	// readable by it.
	for _, p := range []string{dir, filepath.Join(dir, "clockshim.so"), filepath.Join(dir, "clockshim.offset")} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pg := pgtest.StartEnv(t, clock.Env())
	now := time.Now()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.Local)
	if err := clock.Set(midnight.Add(-2 * time.Second).Sub(now)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	var before time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before); err != nil || before.Local().Hour() != 23 {
		t.Fatalf("the database's clock reads %v (%v), want just before midnight", before.Local(), err)
	}
	s := pgstore.New(pool, "idemproxy", "midnight:")
	defer s.Close()
	done, running := s.Codec().Key("p", "r", "done"), s.Codec().Key("p", "r", "running")
	rec := contract.NewRecord(t)
	if _, err := s.Claim(ctx, done, rec, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, done, contract.Completed(rec, "before midnight"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Claim(ctx, running, contract.NewRecord(t), time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim before midnight: %+v %v", res, err)
	}
	time.Sleep(3 * time.Second)
	var after time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&after); err != nil || after.Local().Day() == before.Local().Day() {
		t.Fatalf("the database's clock reads %v (%v), want past midnight", after.Local(), err)
	}
	if res, err := s.Claim(ctx, done, contract.NewRecord(t), time.Minute, claim.Quota{}); err != nil || res.Claimed || res.Existing == nil || string(res.Existing.Body) != "before midnight" {
		t.Errorf("the completed key after midnight: %+v %v, want its record", res, err)
	}
	if res, err := s.Claim(ctx, running, contract.NewRecord(t), time.Minute, claim.Quota{}); err != nil || res.Claimed || res.Existing == nil || res.Existing.State != claim.InProgress {
		t.Errorf("the claimed key after midnight: %+v %v, want the claim in progress", res, err)
	}
}

// TestClaimNotSentWhileDown: while PostgreSQL refuses connections, a
// claim that could get none provably wrote nothing (claim.ErrNotSent), so
// its owner queues no cleanup for it. Before, pgstore never said so, and
// every claim during an outage queued a cleanup retried for a lease.
func TestClaimNotSentWhileDown(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL+"&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool, "idemproxy", "idem:")
	t.Cleanup(s.Close)
	key := s.Codec().Key("alice", "route", "up")
	if res, err := s.Claim(ctx, key, contract.NewRecord(t), time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim while up: %+v, %v", res, err)
	}
	srv.Stop()
	pool.Reset() // the idle connections are gone with the server: a claim must dial
	for i := range 3 {
		_, err := s.Claim(ctx, s.Codec().Key("alice", "route", fmt.Sprint("down-", i)), contract.NewRecord(t), time.Minute, claim.Quota{})
		if !errors.Is(err, claim.ErrUnavailable) || !errors.Is(err, claim.ErrNotSent) {
			t.Fatalf("claim %d while PostgreSQL refuses connections: %v; want ErrUnavailable and ErrNotSent", i, err)
		}
	}
}

// TestClaimRefusedByAReadOnlyServer (issue 62): a claim refused because
// the server is read-only (SQLSTATE 25006: a demoted primary, or a standby
// the pool reached after a failover) wrote nothing: it is
// claim.ErrNotSent, and the pool drops its connections, so that the next
// claim dials again and succeeds once the server takes writes.
func TestClaimRefusedByAReadOnlyServer(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool, "idemproxy", "idem:")
	t.Cleanup(s.Close)
	admin := srv.Conn(t)
	readOnly := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE postgres SET default_transaction_read_only = %v", on)); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := s.Claim(ctx, s.Codec().Key("alice", "route", "before"), contract.NewRecord(t), time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	readOnly(true)
	pool.Reset() // the setting applies to new sessions
	_, err = s.Claim(ctx, s.Codec().Key("alice", "route", "read-only"), contract.NewRecord(t), time.Minute, claim.Quota{})
	if !errors.Is(err, claim.ErrUnavailable) || !errors.Is(err, claim.ErrNotSent) {
		t.Fatalf("claim on a read-only server: %v; want ErrUnavailable and ErrNotSent", err)
	}
	readOnly(false)
	// No Reset here: the store dropped the read-only sessions itself.
	if res, err := s.Claim(ctx, s.Codec().Key("alice", "route", "read-only"), contract.NewRecord(t), time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim once the server takes writes again: %+v, %v; want claimed (its read-only connection dropped)", res, err)
	}
}

// TestWritesNeverWaitOnWakeUps (issue 62): a wake-up that cannot be sent
// fails no write. The sidecar's role may not call pg_notify here (the
// cheapest way to make every notification fail; a full notification
// queue, which any session of the cluster can cause, fails them the same
// way): completions, releases, orphans settled and stream writes are
// still stored, the failed wake-ups are counted, and a waiter still wakes
// (by its poll). v0.7.0 notified inside each writing function's
// transaction, and every one of these writes failed.
func TestWritesNeverWaitOnWakeUps(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	ctx := context.Background()
	admin := srv.Conn(t)
	setup, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, setup, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE ROLE runtime LOGIN"); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Grant(ctx, setup, "idemproxy", "runtime"); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	for _, q := range []string{
		"REVOKE EXECUTE ON FUNCTION pg_catalog.pg_notify(text, text) FROM PUBLIC",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = "runtime"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := pgstore.New(pool, "idemproxy", "idem:")
	t.Cleanup(s.Close)

	key := s.Codec().Key("alice", "route", "completed")
	rec := contract.NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	watch := s.Watch(ctx, key)
	defer watch.Stop()
	if how, err := s.Complete(ctx, key, contract.Completed(rec, `{"id":1}`), time.Hour); err != nil || how != claim.Stored {
		t.Fatalf("complete while no wake-up can be sent: %v, %v; want stored", how, err)
	}
	got, _, err := s.Get(ctx, key)
	if err != nil || got == nil || got.State != claim.Completed {
		t.Fatalf("after the completion: %+v, %v; want the completed record", got, err)
	}

	freed := s.Codec().Key("alice", "route", "released")
	rec2 := contract.NewRecord(t)
	if _, err := s.Claim(ctx, freed, rec2, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, freed, rec2.Token); err != nil {
		t.Fatalf("release while no wake-up can be sent: %v", err)
	}
	if got, _, err := s.Get(ctx, freed); err != nil || got != nil {
		t.Fatalf("after the release: %+v, %v; want the key free", got, err)
	}

	streamed := s.Codec().Key("alice", "route", "streamed")
	rec3 := contract.NewRecord(t)
	if _, err := s.Claim(ctx, streamed, rec3, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	head := *rec3
	head.State, head.Status = claim.Streamed, 200
	at, err := s.StreamStart(ctx, streamed, &head, time.Hour, time.Minute)
	if err != nil {
		t.Fatalf("stream start while no wake-up can be sent: %v", err)
	}
	if at, err = s.StreamAppend(ctx, streamed, rec3.Token, at, []byte("data: 1\n\n"), time.Minute); err != nil {
		t.Fatalf("stream append while no wake-up can be sent: %v", err)
	}
	if err := s.StreamFinish(ctx, streamed, rec3.Token, claim.StreamEnded, at); err != nil {
		t.Fatalf("stream end while no wake-up can be sent: %v", err)
	}
	if n := s.NotifyFailures(); n < 5 {
		t.Errorf("%d failed wake-ups counted, want one per write (5)", n)
	}
}

// TestContractThroughPgBouncer (issue 62): the whole contract suite
// through a real PgBouncer in transaction mode (the pooler most fleets put
// in front of PostgreSQL), on the sidecar's pool (statement
// descriptions cached; the stores' calls named until the pooler routes
// one where its name is unknown, then unnamed: named.go), the LISTEN
// connection straight to the database (store.postgres.listen_url).
// v0.7.0's named prepared statements failed here ("prepared statement
// stmtcache_... already exists").
func TestContractThroughPgBouncer(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	b := srv.Bouncer(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(b.URL + "&pool_max_conns=64")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	direct, err := pgx.ParseConfig(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	contract.Run(t, bounced{deployment: deployment{pool: pool, schema: "idemproxy"}, listen: direct})
}

// bounced is a deployment behind a pooler, its stores listening on a
// connection of their own.
type bounced struct {
	deployment
	listen *pgx.ConnConfig
}

func (d bounced) Open(t *testing.T, prefix string, opts ...claim.Option) claim.Backend {
	s := pgstore.New(d.pool, d.schema, prefix, opts...)
	s.ListenWith(d.listen)
	t.Cleanup(s.Close)
	return s
}

// TestStreamWALGrowsWithItsLength: a 1 MiB stream appended 1 KiB at a
// time writes, with its chunks as rows (record_format 5), less than 3
// MiB of WAL, and reads back whole; each append rewriting the whole value
// (record_format 4) wrote 565 MiB for the same stream (incompressible
// events: TOAST rewrites the whole value on every update).
func TestStreamWALGrowsWithItsLength(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := open(t)
	ctx := context.Background()
	s := pgstore.New(pool, "idemproxy", "wal:", claim.WithStreamRows(true))
	t.Cleanup(s.Close)
	key := s.Codec().Key("alice", "chat", "long")
	head, at := contract.StartedStream(t, s, key)
	lsn := func() (n int64) {
		if err := pool.QueryRow(ctx, "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const size, chunk = 1 << 20, 1 << 10
	before := lsn()
	event := make([]byte, chunk)
	rng := rand.New(rand.NewPCG(1, 2)) // incompressible, as sealed or compressed events are
	for i := 0; i < size/chunk; i++ {
		for j := range event {
			event[j] = byte(rng.Uint32())
		}
		event[0] = byte(i)
		var err error
		if at, err = s.StreamAppend(ctx, key, head.Token, at, event, time.Minute); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	wal := lsn() - before
	t.Logf("a %d KiB stream in %d appends wrote %d KiB of WAL (%.2fx)", size>>10, size/chunk, wal>>10, float64(wal)/size)
	if wal > 3*size {
		t.Fatalf("a %d KiB stream wrote %d KiB of WAL: more than 3 times its size", size>>10, wal>>10)
	}
	if err := s.StreamFinish(ctx, key, head.Token, claim.StreamEnded, at); err != nil {
		t.Fatal(err)
	}
	part, err := s.StreamRead(ctx, key, 0, 2*size)
	if err != nil || part.End != claim.StreamEnded || len(part.Data) < size {
		t.Fatalf("read back: %d bytes, %v, %v", len(part.Data), part.End, err)
	}
	for i := 0; i < size/chunk; i++ {
		if got := part.Data[len(part.Data)-size+i*chunk]; got != byte(i) {
			t.Fatalf("chunk %d reads back as %d: out of order", i, got)
		}
	}
}

// TestStreamRowsValueAloneIsRefused (issue 78): under record_format 5 a
// stream's value alone, which is all a release without chunk rows reads
// (v0.7.0), decodes as corrupt (its head is one byte longer than the
// value: that release answers 500 record-unreadable) instead of as a
// complete, empty stream; the value and its rows together read back whole,
// ended, with every chunk. Under record_format 4 the value alone is the
// whole stream, as v0.7.0 wrote it. Before the head was split, the value
// alone decoded as a complete stream with an empty body (tried).
func TestStreamRowsValueAloneIsRefused(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := open(t)
	ctx := context.Background()
	for _, rows := range []bool{true, false} {
		s := pgstore.New(pool, "idemproxy", fmt.Sprintf("alone-%v:", rows), claim.WithStreamRows(rows))
		t.Cleanup(s.Close)
		key := s.Codec().Key("alice", "chat", "short")
		head, at := contract.StartedStream(t, s, key)
		at, err := s.StreamAppend(ctx, key, head.Token, at, []byte("data: one\n\n"), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.StreamFinish(ctx, key, head.Token, claim.StreamEnded, at); err != nil {
			t.Fatal(err)
		}
		var alone []byte
		if err := pool.QueryRow(ctx, "SELECT value FROM idemproxy.records WHERE key = $1", key).Scan(&alone); err != nil {
			t.Fatal(err)
		}
		rec, err := claim.Decode(alone)
		switch {
		case rows && !errors.Is(err, claim.ErrCorrupt):
			t.Errorf("record_format 5: the value alone decodes as %+v, %v; want it refused as corrupt, not replayed short", rec, err)
		case !rows && (err != nil || string(rec.Body) != "data: one\n\n"):
			t.Errorf("record_format 4: the value alone decodes as %+v, %v; want the whole stream", rec, err)
		}
		got, _, err := s.Get(ctx, key)
		if err != nil || got.StreamEnd != claim.StreamEnded || string(got.Body) != "data: one\n\n" {
			t.Errorf("rows %v: read back as %+v, %v; want the whole, ended stream", rows, got, err)
		}
	}
}
