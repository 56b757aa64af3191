package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// pgUnits (go run ./bench pgunits) measures what the PostgreSQL store
// costs on disk: the bytes a settled record takes in the records table
// (with its indexes and TOAST) and the WAL each operation writes (a
// claim, a completion, an expiry), over n keys with answers of size bytes.
func pgUnits(args []string) error {
	fs := flag.NewFlagSet("pgunits", flag.ContinueOnError)
	n := fs.Int("n", 20000, "keys")
	size := fs.Int("response-bytes", 1024, "bytes of each stored answer's body")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pg, err := pgtest.Launch()
	if err != nil {
		return err
	}
	defer pg.Close()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, "idemproxy"); err != nil {
		return err
	}
	s := pgstore.New(pool, "idemproxy", "idem:")
	defer s.Close()
	wal := func() int64 {
		var lsn int64
		pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&lsn)
		return lsn
	}
	tableBytes := func() int64 {
		var b int64
		pool.Exec(ctx, "VACUUM idemproxy.records")
		pool.QueryRow(ctx, "SELECT pg_total_relation_size('idemproxy.records')").Scan(&b)
		return b
	}
	body := make([]byte, *size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	recs := make([]*claim.Record, *n)
	keys := make([]string, *n)
	for i := range recs {
		recs[i] = &claim.Record{State: claim.InProgress, Created: time.Now(), RequestID: fmt.Sprintf("%032x", i)}
		recs[i].Token[0], recs[i].Token[1], recs[i].Fingerprint[0] = byte(i), byte(i>>8), 7
		keys[i] = s.Codec().Key("bench", "pay", fmt.Sprint(i))
	}
	before, bytes0 := wal(), tableBytes()
	for i, rec := range recs {
		if _, err := s.Claim(ctx, keys[i], rec, 10*time.Second, claim.Quota{}); err != nil {
			return err
		}
	}
	afterClaims := wal()
	for i, rec := range recs {
		done := *rec
		done.State, done.Completed, done.Status, done.Body = claim.Completed, time.Now(), http.StatusCreated, body
		done.Header = http.Header{"Content-Type": {"application/json"}}
		if _, err := s.Complete(ctx, keys[i], &done, time.Second); err != nil {
			return err
		}
	}
	afterCompletes, bytes1 := wal(), tableBytes()
	time.Sleep(1100 * time.Millisecond) // every record's retention (1 s) over
	for {
		gone, err := s.Expire(ctx, 5000)
		if err != nil {
			return err
		}
		if gone == 0 {
			break
		}
	}
	afterExpiry := wal()
	fmt.Fprintf(os.Stdout, "PostgreSQL store, %d keys, %d-byte answers:\n", *n, *size)
	fmt.Fprintf(os.Stdout, "  on disk per settled record (table, indexes, TOAST): %.0f bytes\n", float64(bytes1-bytes0)/float64(*n))
	fmt.Fprintf(os.Stdout, "  WAL per claim: %.0f bytes; per completion: %.0f bytes; per expiry: %.0f bytes\n",
		float64(afterClaims-before)/float64(*n), float64(afterCompletes-afterClaims)/float64(*n), float64(afterExpiry-afterCompletes)/float64(*n))
	return nil
}
