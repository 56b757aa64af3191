package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/faultlink"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// harnessPostgres is harness on the PostgreSQL store (-store postgres):
// one PostgreSQL server, each sidecar reaching it through a fault link.
func harnessPostgres(o options, dir string, bins, versions []string) error {
	pg, err := pgtest.Launch()
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
	led := &ledger{hangFor: 3 * time.Second, failRate: 0.02, transientRate: 0.02}
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	up := &http.Server{Handler: led, ReadHeaderTimeout: 5 * time.Second}
	go up.Serve(upLn)
	defer up.Close()

	scs, err := startSidecars(o, dir, bins, versions, "http://"+upLn.Addr().String(), links)
	for _, sc := range scs {
		defer sc.kill()
	}
	if err != nil {
		return err
	}
	pace := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
	defer pace.Stop()
	w := &workload{
		pace:     pace.C,
		sidecars: scs, principals: 5, maxOps: o.ops, deadline: time.Now().Add(o.duration), stream: o.stream,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	}
	inj := &injector{pg: pg, links: links, ledger: led, sidecars: scs}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { inj.run(ctx, o.faultEvery) })
	start := time.Now()
	fmt.Printf("load: %d operations at %.0f/s, %d workers, %d sidecars on PostgreSQL, a fault every ~%s\n", o.ops, o.rate, o.workers, o.sidecars, o.faultEvery)
	w.run(o.workers)
	stop()
	wg.Wait()
	elapsed := time.Since(start)
	inj.heal()
	pg.Signal(syscall.SIGCONT) // a stop cut short by the end of the load is undone
	return judge(o, dir, func() (int, int, error) { return countInProgressPostgres(pg.URL) }, scs, w, led, inj, elapsed)
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
	rows, err := conn.Query(ctx, "SELECT key, value, expires_ms - idemproxy.idem_now() FROM idemproxy.records WHERE expires_ms > idemproxy.idem_now() AND key NOT LIKE 'idem:epoch%' AND key NOT LIKE 'idem:since:%'")
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
