package pgstore

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// batchStore is a store on a fresh server, its batches' sizes counted
// into largest.
func batchStore(t *testing.T, largest *atomic.Int64, settings ...string) *Store {
	t.Helper()
	srv := pgtest.Start(t, settings...)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL+"&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	s := New(pool, "idemproxy", "batch:", claim.WithBatchObserver(func(n int) {
		for {
			cur := largest.Load()
			if int64(n) <= cur || largest.CompareAndSwap(cur, int64(n)) {
				return
			}
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// claimOp is a claim of key as one operation of a batch, its answer's
// kind in kind (1: claimed, 3: in progress).
func claimOp(s *Store, key string, ttl int64, kind *int) *op {
	rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
	rec.Token[0] = byte(len(key))
	var cur []byte
	var pttl, length *int64
	var now int64
	return &op{ctx: context.Background(), name: "claim", fn: "idem_claim", key: key,
		args: []any{key, s.codec.Encode(key, rec), ttl, 0, nil, int64(0), int64(0)},
		dst:  []any{kind, &cur, &pttl, &now, &length}}
}

// TestBatchAnswersEachOperation: the operations of one batch commit
// together and each gets its own answer, the same key twice in order;
// when the server refuses one of them (here an expiry past bigint), the
// transaction rolls back whole and every operation runs again alone: the
// others are stored, and only the refused one fails.
func TestBatchAnswersEachOperation(t *testing.T) {
	t.Parallel() // on a server of its own
	var largest atomic.Int64
	s := batchStore(t, &largest)
	ctx := context.Background()

	kinds := make([]int, 4)
	batch := []*op{claimOp(s, "batch:b", 60000, &kinds[0]), claimOp(s, "batch:a", 60000, &kinds[1]), claimOp(s, "batch:a", 60000, &kinds[2]), claimOp(s, "batch:c", 60000, &kinds[3])}
	s.batch.send(batch)
	for i, o := range batch {
		if o.err != nil {
			t.Fatalf("operation %d (%s): %v", i, o.key, o.err)
		}
	}
	if kinds[0] != 1 || kinds[1] != 1 || kinds[2] != 3 || kinds[3] != 1 {
		t.Fatalf("kinds %v: want claimed, claimed, the first's claim in progress, claimed", kinds)
	}
	if n := largest.Load(); n != 4 {
		t.Fatalf("largest batch %d, want the 4 operations together", n)
	}

	var good [3]int
	var bad int
	batch = []*op{claimOp(s, "batch:d", 60000, &good[0]), claimOp(s, "batch:e", math.MaxInt64, &bad), claimOp(s, "batch:f", 60000, &good[1]), claimOp(s, "batch:g", 60000, &good[2])}
	s.batch.send(batch)
	if err := batch[1].err; err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("the refused operation: %v, want its own bigint out of range", err)
	}
	for i, o := range []*op{batch[0], batch[2], batch[3]} {
		if o.err != nil || good[i] != 1 {
			t.Fatalf("%s, in the refused one's batch: kind %d, %v; want claimed on its own", o.key, good[i], o.err)
		}
		if rec, _, err := s.Get(ctx, o.key); err != nil || rec == nil {
			t.Fatalf("%s not stored: %v, %v", o.key, rec, err)
		}
	}
	if rec, _, err := s.Get(ctx, "batch:e"); err != nil || rec != nil {
		t.Fatalf("the refused claim stored: %v, %v", rec, err)
	}
}

// TestConcurrentOperationsRideBatches: under -race, 64 first attempts at
// once (a claim, then its completion) ride shared batches, each claim
// its own key's, every batch's wake-ups are sent, and every key replays
// its own answer.
func TestConcurrentOperationsRideBatches(t *testing.T) {
	t.Parallel() // on a server of its own
	var largest atomic.Int64
	s := batchStore(t, &largest)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			key := fmt.Sprintf("batch:k%d", i)
			rec := &claim.Record{State: claim.InProgress, Created: time.Now()}
			rec.Token[0], rec.Token[1] = byte(i), 1
			res, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{})
			if err != nil || !res.Claimed {
				errs <- fmt.Errorf("%s: claimed %v, %v", key, res.Claimed, err)
				return
			}
			done := *rec
			done.State, done.Status, done.Body, done.Completed = claim.Completed, 201, []byte(key), time.Now()
			if _, err := s.Complete(ctx, key, &done, time.Hour); err != nil {
				errs <- fmt.Errorf("%s: complete: %v", key, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if largest.Load() < 2 {
		t.Errorf("largest batch %d: 64 concurrent operations never shared one", largest.Load())
	}
	if n := s.NotifyFailures(); n != 0 {
		t.Errorf("%d batches' wake-ups failed: the one statement that wakes a batch's keys", n)
	}
	for i := range 64 {
		key := fmt.Sprintf("batch:k%d", i)
		rec, _, err := s.Get(ctx, key)
		if err != nil || rec == nil || rec.State != claim.Completed || string(rec.Body) != key {
			t.Fatalf("%s: %+v, %v; want its own completed answer", key, rec, err)
		}
	}
}

// TestBatchesLockInKeyOrder: two batches that claim the same two keys,
// written in opposite orders and sent at once, over and over, never
// deadlock (the server's count stays 0): each takes its rows' locks in
// key order. (deadlock_timeout 10ms, so that a deadlock, were there one,
// is found at once.)
func TestBatchesLockInKeyOrder(t *testing.T) {
	t.Parallel() // on a server of its own
	var largest atomic.Int64
	s := batchStore(t, &largest, "deadlock_timeout", "10ms")
	ctx := context.Background()
	for round := range 200 {
		x, y := fmt.Sprintf("batch:x%d", round), fmt.Sprintf("batch:y%d", round)
		var kinds [4]int
		var wg sync.WaitGroup
		wg.Go(func() { s.batch.send([]*op{claimOp(s, x, 60000, &kinds[0]), claimOp(s, y, 60000, &kinds[1])}) })
		wg.Go(func() { s.batch.send([]*op{claimOp(s, y, 60000, &kinds[2]), claimOp(s, x, 60000, &kinds[3])}) })
		wg.Wait()
	}
	var deadlocks int64
	if err := s.pool.QueryRow(ctx, "SELECT deadlocks FROM pg_catalog.pg_stat_database WHERE datname = current_database()").Scan(&deadlocks); err != nil {
		t.Fatal(err)
	}
	if deadlocks != 0 {
		t.Fatalf("%d deadlocks between two batches over the same keys", deadlocks)
	}
}
