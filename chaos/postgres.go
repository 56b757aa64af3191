package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/clockshim"
	"github.com/idemproxy/idemproxy/internal/faultlink"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// harnessPostgres is harness on the PostgreSQL store (-store postgres):
// one PostgreSQL server, each sidecar reaching it through a fault link.
func harnessPostgres(o options, dir string, bins, versions []string) error {
	// Steps of PostgreSQL's clock: the shim in its environment, its
	// files readable by the postgres user it runs as.
	clock, err := clockshim.Build(dir)
	if err != nil {
		return err
	}
	for _, p := range []string{dir, filepath.Join(dir, "clockshim.so"), filepath.Join(dir, "clockshim.offset")} {
		if err := os.Chmod(p, 0o755); err != nil {
			return err
		}
	}
	pg, err := pgtest.LaunchEnv(clock.Env())
	if err != nil {
		return fmt.Errorf("-store postgres: %w", err)
	}
	defer pg.Close()
	links := make([]*faultlink.Link, o.sidecars)
	for i := range links {
		if links[i], err = faultlink.Start(pg.Addr); err != nil {
			return err
		}
		defer links[i].Close()
	}
	inj := &injector{pg: pg, links: links, clock: clock, leaps: o.reconcile}
	return drive(o, dir, bins, versions, links, inj, " on PostgreSQL", func() (int, int, error) { return countInProgressPostgres(pg.URL) })
}

// countInProgressPostgres is countInProgress on the PostgreSQL store: the
// live rows in progress, stuck (lease running) or orphaned.
func countInProgressPostgres(url string) (stuck, orphans int, err error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT key, value, expires_ms - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM idemproxy.records WHERE expires_ms > floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AND key NOT LIKE 'idem:epoch%' AND key NOT LIKE 'idem:since:%'")
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var v []byte
		var pttl int64
		if err := rows.Scan(&key, &v, &pttl); err != nil {
			return 0, 0, err
		}
		rec, err := claim.Decode(v)
		if err != nil {
			return 0, 0, fmt.Errorf("undecodable record %s: %w", key, err)
		}
		if rec.State != claim.InProgress {
			continue
		}
		if rec.Orphaned(max(time.Duration(pttl)*time.Millisecond-rec.Tail, 0)) {
			orphans++
		} else {
			stuck++
		}
	}
	return stuck, orphans, rows.Err()
}
