package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
}

func (d deployment) Open(t *testing.T, prefix string, opts ...claim.Option) claim.Backend {
	s := pgstore.New(d.pool, d.schema, prefix, opts...)
	t.Cleanup(s.Close)
	return s
}

func (d deployment) table() string { return pgx.Identifier{d.schema, "records"}.Sanitize() }

func (d deployment) Raw(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := d.pool.QueryRow(ctx, "SELECT value FROM "+d.table()+" WHERE key = $1 AND expires_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)", key).Scan(&v)
	if err == pgx.ErrNoRows {
		return nil, nil
	}
	return v, err
}

func (d deployment) Plant(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	_, err := d.pool.Exec(ctx, "INSERT INTO "+d.table()+" (key, value, expires_ms) VALUES ($1, $2, floor(extract(epoch FROM clock_timestamp()) * 1000) + $3) "+
		"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_ms = EXCLUDED.expires_ms", key, value, ttl.Milliseconds())
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

// TestContract runs the shared contract suite (claim/contract) against a
// real PostgreSQL server.
func TestContract(t *testing.T) {
	contract.Run(t, deployment{pool: open(t), schema: "idemproxy"})
}

// TestHealthReportsCleanup: Health reports the expired rows not deleted
// yet and how long ago the oldest expired, deletes them (the store
// watcher calls it every second), and reports the oldest claim in
// progress by its Created time; all by the indexes.
func TestHealthReportsCleanup(t *testing.T) {
	d := deployment{pool: open(t), schema: "idemproxy"}
	ctx := context.Background()
	s := d.Open(t, "cleanup:")
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
