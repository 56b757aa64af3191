package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// BenchmarkFirstAttempt is a claim and its completion on one server, by
// how the store sends its calls: named (prepared once per connection,
// the default since issue 65) against unnamed (parsed and planned for
// each call; what the store falls back to behind a transaction pooler).
// The pool is the sidecar's (descriptions cached, pgx's own statements
// unnamed). docs/benchmarks.md has the figures.
func BenchmarkFirstAttempt(b *testing.B) { benchModes(b, false) }

// BenchmarkReplay is a claim that finds its key's settled record, by
// statement mode as BenchmarkFirstAttempt's.
func BenchmarkReplay(b *testing.B) { benchModes(b, true) }

// benchModes runs first attempts (or replays) under each statement mode.
func benchModes(b *testing.B, replay bool) {
	var keys atomic.Int64
	srv := pgtest.Start(b)
	ctx := context.Background()
	for _, named := range []bool{true, false} {
		mode := map[bool]string{true: "named", false: "unnamed"}[named]
		b.Run(mode, func(b *testing.B) {
			cfg, err := pgxpool.ParseConfig(srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
				b.Fatal(err)
			}
			s := pgstore.New(pool, "idemproxy", "idem:")
			defer s.Close()
			s.SetNamed(named)
			rec := contract.NewRecord(&testing.T{})
			done := contract.Completed(rec, `{"id":1}`)
			settled := s.Codec().Key(mode, "route", fmt.Sprint("settled-", keys.Add(1)))
			if _, err := s.Claim(ctx, settled, rec, time.Minute, claim.Quota{}); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Complete(ctx, settled, done, time.Hour); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				again := contract.NewRecord(&testing.T{})
				for pb.Next() {
					if replay {
						if res, err := s.Claim(ctx, settled, again, time.Minute, claim.Quota{}); err != nil || res.Existing == nil {
							b.Fatal(res, err)
						}
						continue
					}
					key := s.Codec().Key(mode, "route", fmt.Sprint(keys.Add(1)))
					if _, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{}); err != nil {
						b.Fatal(err)
					}
					if _, err := s.Complete(ctx, key, done, time.Hour); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
