package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// namedPool is a pool of one connection on a fresh server, the schema
// installed.
func namedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := namedPoolAt(t)
	return pool
}

// namedPoolAt is namedPool and the server's URL.
func namedPoolAt(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	srv := pgtest.Start(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	return pool, srv.URL
}

// claimKey claims key on s for a new owner (its token's first byte the
// key's length), failing t unless it is claimed.
func claimKey(t *testing.T, s *Store, key string) *claim.Record {
	t.Helper()
	rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
	rec.Token[0] = byte(len(key))
	if res, err := s.Claim(context.Background(), key, rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim %s: %+v, %v", key, res, err)
	}
	return rec
}

// completeKey completes rec's claim of key on s: 201, the key as body.
func completeKey(s *Store, key string, rec *claim.Record) error {
	done := *rec
	done.State, done.Status, done.Body, done.Completed = claim.Completed, 201, []byte(key), time.Now()
	_, err := s.Complete(context.Background(), key, &done, time.Hour)
	return err
}

// TestCallsGoOutNamed: the schema's calls are prepared on the connection
// by name, once, and the server holds them there. Fails with every call
// sent unnamed (as before).
func TestCallsGoOutNamed(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := namedPool(t)
	ctx := context.Background()
	s := New(pool, "idemproxy", "named:")
	t.Cleanup(s.Close)
	for i := range 3 {
		kind := 0
		if s.batch.send([]*op{claimOp(s, "named:k", 60000, &kind)}); kind == 0 {
			t.Fatalf("claim %d: no answer", i)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'SELECT %.idem_v3_claim(%' AND statement NOT LIKE '%pg_prepared_statements%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !s.Named() {
		t.Errorf("the claim is prepared %d times on the connection (named: %v), want once", n, s.Named())
	}
}

// TestNamedStatementsLostFallBack: a named statement the server does not
// have (what a transaction pooler's next server connection answers: here
// the connection's statements deallocated under the store) refuses the
// call whole; the store sends every call unnamed from then on, says so
// once, and the call runs again: alone, alone with its wake-up, or in a
// batch, the caller gets its answer. Fails with the call not run again
// (each path: tried), or with the store staying named.
func TestNamedStatementsLostFallBack(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := namedPool(t)
	ctx := context.Background()
	lose := func() {
		t.Helper()
		err := pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
			_, err := c.Conn().PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{"alone", "notify", "batch"} {
		t.Run(path, func(t *testing.T) {
			s := New(pool, "idemproxy", path+":")
			t.Cleanup(s.Close)
			told := 0
			s.OnUnnamed(func(error) { told++ })
			warm := path + ":warm"
			if err := completeKey(s, warm, claimKey(t, s, warm)); err != nil { // both statements prepared
				t.Fatal(err)
			}
			switch path {
			case "alone":
				lose()
				claimKey(t, s, path+":k")
			case "notify":
				rec := claimKey(t, s, path+":k")
				lose()
				if err := completeKey(s, path+":k", rec); err != nil {
					t.Fatalf("complete after the statement was lost: %v", err)
				}
			case "batch":
				lose()
				kinds := make([]int, 2)
				batch := []*op{claimOp(s, path+":a", 60000, &kinds[0]), claimOp(s, path+":b", 60000, &kinds[1])}
				s.batch.send(batch)
				for i, o := range batch {
					if o.err != nil || kinds[i] != 1 {
						t.Fatalf("%s after the statement was lost: kind %d, %v", o.key, kinds[i], o.err)
					}
				}
			}
			if s.Named() || told != 1 {
				t.Errorf("named %v, told %d times, want unnamed and told once", s.Named(), told)
			}
		})
	}
}

// TestLostWakeStatementWakesAgain: a wake-up whose named statement the
// server does not have (a transaction pooler handed the session another
// server connection after the write's Sync; here the statement is
// deallocated under the store) is sent again, unnamed, and the waiter is
// woken. Before, the write stood and its wake-up was dropped: through
// PgBouncer under load, one contract run in five waited in vain for the
// wake-up of a settled orphan.
func TestLostWakeStatementWakesAgain(t *testing.T) {
	t.Parallel() // on a server of its own
	pool, url := namedPoolAt(t)
	ctx := context.Background()
	direct, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	s := New(pool, "idemproxy", "wake:")
	s.ListenWith(direct) // the pool's one connection stays the store's
	t.Cleanup(s.Close)
	if err := completeKey(s, "wake:warm", claimKey(t, s, "wake:warm")); err != nil { // the write's and the wake-up's statements prepared
		t.Fatal(err)
	}
	w := s.Watch(ctx, "wake:k")
	defer w.Stop()
	<-w.C() // live
	rec := claimKey(t, s, "wake:k")
	err = pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		var name string
		if err := c.QueryRow(ctx, "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'SELECT %.idem_v3_wake(%' AND statement NOT LIKE '%pg_prepared_statements%'").Scan(&name); err != nil {
			return err
		}
		_, err := c.Conn().PgConn().Exec(ctx, `DEALLOCATE "`+name+`"`).ReadAll()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := completeKey(s, "wake:k", rec); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(5 * time.Second):
		t.Fatalf("the waiter was not woken: the wake-up refused as a named statement was dropped (notify failures %d)", s.NotifyFailures())
	}
	if s.Named() || s.NotifyFailures() != 0 {
		t.Errorf("named %v, notify failures %d: want unnamed, none", s.Named(), s.NotifyFailures())
	}
}
