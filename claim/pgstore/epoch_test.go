package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestEpochWithoutControlFunctions (issue 62): a role that may not call
// pg_control_system (as on some managed services) still gets its epochs:
// the server is "unknown", and a loss of the records is still seen.
func TestEpochWithoutControlFunctions(t *testing.T) {
	t.Parallel() // on a server of its own
	srv := pgtest.Start(t)
	ctx := context.Background()
	admin := srv.Conn(t)
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE ROLE limited LOGIN", "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_control_system() FROM PUBLIC"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgstore.Grant(ctx, pool, "idemproxy", "limited"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = "limited"
	lp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Close()
	s := pgstore.New(lp, "idemproxy", "idem:")
	defer s.Close()
	es, err := s.CheckEpochs(ctx)
	if err != nil || len(es) != 1 || es[0].Lost {
		t.Fatalf("first look: %+v %v", es, err)
	}
	time.Sleep(2 * time.Millisecond)
	if _, err := admin.Exec(ctx, "TRUNCATE idemproxy.records"); err != nil {
		t.Fatal(err)
	}
	es, err = s.CheckEpochs(ctx)
	if err != nil || len(es) != 1 || !es[0].Lost || !es[0].AfterLoss {
		t.Fatalf("after the records were truncated: %+v %v, want a lost epoch", es, err)
	}
}

// TestFirstSentClaimsLookAtTheEpochOnce (issue 78): first-sent claims
// under concurrency (each reads the epoch in its own transaction, then
// asks EpochStart, as the proxy does) look at the epoch about once a
// second, not once per claim: a look raises the watermark, and a claim
// sent before that raise committed reads the one below it, which is no
// loss. When every such claim took it for one, each asked for a look of
// its own and the looks raised the watermark again: 3 s of claims made
// hundreds of looks (tried), and first-sent first attempts ran at 0.45x
// the ones without the header.
func TestFirstSentClaimsLookAtTheEpochOnce(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := open(t)
	ctx := context.Background()
	var looks atomic.Int64
	s := pgstore.New(pool, "idemproxy", "looks:", claim.WithEpochObserver(func(claim.Epoch) { looks.Add(1) }))
	t.Cleanup(s.Close)
	if _, err := s.CheckEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	// Past a few seconds: a look stands for one (epochFresh).
	const workers, lasting = 32, 3 * time.Second
	start := time.Now()
	var wg sync.WaitGroup
	var claims atomic.Int64
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < lasting; i++ {
				claims.Add(1)
				key := s.Codec().Key("alice", "pay", fmt.Sprintf("%d-%d", w, i))
				rec := contract.NewRecord(t)
				rec.ReadEpoch = true
				if _, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{}); err != nil {
					errs <- err
					return
				}
				if _, err := s.EpochStart(ctx, key); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	// One look a second (epochFresh) and the first; a second's margin.
	bound := int64(elapsed/time.Second) + 3
	t.Logf("%d first-sent claims in %v: %d looks at the epoch", claims.Load(), elapsed.Round(time.Millisecond), looks.Load()-1)
	if n := looks.Load() - 1; n > bound {
		t.Fatalf("%d first-sent claims made %d looks at the epoch in %v; want at most %d (one a second)", claims.Load(), n, elapsed.Round(time.Millisecond), bound)
	}
}

// TestStaleNoteDuringALookAsksForAnother (issue 78): a claim that reads
// another epoch than the one last looked at, while a look is under way,
// has the next EpochStart look again: the look may have read the store
// before the claim did. The look used to clear the note when it ended,
// and EpochStart answered from it: a first-sent retry that read a
// restored store could run on a look taken before the restore (tried).
func TestStaleNoteDuringALookAsksForAnother(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := open(t)
	ctx := context.Background()
	var looks atomic.Int64
	s := pgstore.New(pool, "idemproxy", "midlook:", claim.WithEpochObserver(func(claim.Epoch) { looks.Add(1) }))
	t.Cleanup(s.Close)
	s.NoteMidLook()
	if _, err := s.CheckEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	s.NoMidLook()
	if _, err := s.EpochStart(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := looks.Load(); n != 2 {
		t.Fatalf("%d looks, want 2: EpochStart answered from a look a claim's read contradicted while it ran", n)
	}
	if _, err := s.EpochStart(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if n := looks.Load(); n != 2 {
		t.Fatalf("%d looks, want still 2: a look nothing contradicted stands for a second", n)
	}
}
