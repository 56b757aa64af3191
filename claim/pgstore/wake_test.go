package pgstore

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestWakeUpsOnlyForWaitedKeys: a completion of a key nobody waits for
// sends no NOTIFY, and one of a key with a waiter does, alone or in a
// batch; a stopped watch deletes its registration. Notifications arrive
// in commit order, so the first one a raw listener hears after both
// completions names the waited key only if the other sent none. Fails
// with the wake-up sent for every key (as before the waiters table).
func TestWakeUpsOnlyForWaitedKeys(t *testing.T) {
	t.Parallel() // on a server of its own
	var largest atomic.Int64
	s := batchStore(t, &largest)
	ctx := context.Background()
	raw, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(ctx)
	if _, err := raw.Exec(ctx, "LISTEN idemproxy"); err != nil {
		t.Fatal(err)
	}
	complete := func(key string, rec *claim.Record) {
		if err := completeKey(s, key, rec); err != nil {
			t.Fatalf("complete %s: %v", key, err)
		}
	}
	heard := func() string {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := raw.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return n.Payload
	}

	for _, together := range []bool{false, true} {
		unwaited, waited := "wake:nobody", "wake:waited"
		if together {
			unwaited, waited = unwaited+"-batch", waited+"-batch"
		}
		a, b := claimKey(t, s, unwaited), claimKey(t, s, waited)
		w := s.Watch(ctx, waited)
		if together {
			da, db := *a, *b
			da.State, db.State = claim.Completed, claim.Completed
			batch := []*op{completeOp(s, unwaited, &da), completeOp(s, waited, &db)}
			s.batch.send(batch)
			for _, o := range batch {
				if o.err != nil {
					t.Fatalf("%s: %v", o.key, o.err)
				}
			}
			if largest.Load() < 2 {
				t.Fatal("the two completions did not share a batch")
			}
		} else {
			complete(unwaited, a)
			complete(waited, b)
		}
		if got := heard(); got != waited {
			t.Fatalf("together=%v: first notification for %q, want %q: a key nobody waits for was notified", together, got, waited)
		}
		w.Stop()
	}
	poll.Until(t, "the stopped watches' registrations deleted", func() bool {
		var n int
		if err := raw.QueryRow(ctx, "SELECT count(*) FROM idemproxy.waiters").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// completeOp is a completion of rec under key as one operation of a
// batch.
func completeOp(s *Store, key string, rec *claim.Record) *op {
	var n int
	return &op{ctx: context.Background(), name: "complete", fn: "idem_complete", key: key, wake: true,
		args: []any{key, rec.Token[:], s.codec.Encode(key, rec), time.Hour.Milliseconds()}, dst: []any{&n}}
}

// TestRefusedRegistrationIsToldOnce: a runtime role that may not write
// the waiters table (granted before this release added it) leaves its
// waiters to their poll, and the store says so once, with the server's
// error, however many waiters it refuses. Fails with the refusal dropped
// silently, as before.
func TestRefusedRegistrationIsToldOnce(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := Migrate(ctx, admin, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE ROLE app LOGIN"); err != nil {
		t.Fatal(err)
	}
	if err := Grant(ctx, admin, "idemproxy", "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "REVOKE INSERT, DELETE ON idemproxy.waiters FROM app"); err != nil {
		t.Fatal(err)
	}
	app, err := pgxpool.New(ctx, strings.Replace(srv.URL, "://"+pgtest.User+"@", "://app@", 1))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	s := New(app, "idemproxy", "told:")
	defer s.Close()
	var mu sync.Mutex
	var told []error
	s.OnUnregisteredWaiter(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, err)
	})
	for _, key := range []string{"told:a", "told:b", "told:c"} {
		s.Watch(ctx, key).Stop()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 1 || !strings.Contains(told[0].Error(), "permission denied") {
		t.Fatalf("told %d times (%v), want once, the server's permission error", len(told), told)
	}
}

// TestWaitersOfOneKeyShareOneRegistration: a hundred waiters of one hot
// key on one sidecar write one row of the waiters table, not a hundred
// (each a statement and a pool connection), and every one of them is
// woken by the completion; the row goes once the last stops. Fails with a
// row per waiter.
func TestWaitersOfOneKeyShareOneRegistration(t *testing.T) {
	t.Parallel() // on a server of its own
	var largest atomic.Int64
	s := batchStore(t, &largest)
	ctx := context.Background()
	key := "batch:hot"
	rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
	if res, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	rows := func() int {
		var n int
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM idemproxy.waiters WHERE key = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	watches := make([]claim.Watch, 100)
	var wg sync.WaitGroup
	for i := range watches {
		wg.Go(func() { watches[i] = s.Watch(ctx, key) })
	}
	wg.Wait()
	if n := rows(); n != 1 {
		t.Fatalf("%d rows for 100 waiters of one key, want 1", n)
	}
	for _, w := range watches { // drain the wake-up of the channel going live
		select {
		case <-w.C():
		case <-time.After(10 * time.Second):
			t.Fatal("a watch never went live")
		}
	}
	done := *rec
	done.State, done.Status, done.Completed = claim.Completed, 201, time.Now()
	if _, err := s.Complete(ctx, key, &done, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i, w := range watches {
		select {
		case <-w.C():
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not woken by the completion", i)
		}
	}
	for _, w := range watches[:99] {
		w.Stop()
	}
	if n := rows(); n != 1 {
		t.Fatalf("%d rows while one waiter still waits, want 1", n)
	}
	watches[99].Stop()
	poll.Until(t, "the registration deleted after the last waiter", func() bool { return rows() == 0 })
}
