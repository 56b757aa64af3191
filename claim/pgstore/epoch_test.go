package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestEpochWithoutControlFunctions (issue 62): a role that may not call
// pg_control_system (as on some managed services) still gets its epochs:
// the server is "unknown", and a loss of the records is still seen.
func TestEpochWithoutControlFunctions(t *testing.T) {
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
