package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/pgstore"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// pgUnits (go run ./bench pgunits) measures what the PostgreSQL store
// costs on disk: the bytes a settled record takes in the records table
// (with its indexes and TOAST) and the WAL each operation writes (a
// claim, a completion, an expiry, and the vacuums after them), over n
// keys with answers of size bytes, each phase's pages logged whole read
// with pg_waldump; -existing fills the table first, as a large one is.
// -set and -alter measure what a server setting or a change to the
// tables would save (a fillfactor, an index dropped, wal_compression).
func pgUnits(args []string) error {
	fs := flag.NewFlagSet("pgunits", flag.ContinueOnError)
	n := fs.Int("n", 20000, "keys")
	size := fs.Int("response-bytes", 1024, "bytes of each stored answer's body")
	existing := fs.Int("existing", 0, "settled records already in the table before the measured keys (a large table's index: more pages, each logged whole on its first change after a checkpoint)")
	var settings, alters []string
	fs.Func("set", "a server setting, name=value (repeatable): wal_compression=lz4", func(v string) error {
		name, value, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want name=value, got %q", v)
		}
		settings = append(settings, name, value)
		return nil
	})
	fs.Func("alter", "a statement run after the schema is installed (repeatable): ALTER TABLE idemproxy.records SET (fillfactor = 80)", func(v string) error {
		alters = append(alters, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	// WAL is kept for pg_waldump to read each phase's after the checkpoints.
	pg, err := pgtest.Launch(append([]string{"wal_keep_size", "8GB"}, settings...)...)
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
	for _, q := range alters {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("-alter %q: %w", q, err)
		}
	}
	s := pgstore.New(pool, "idemproxy", "idem:")
	defer s.Close()
	wal := func() walAt {
		var at walAt
		pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_current_wal_lsn()::text").Scan(&at.n, &at.lsn)
		return at
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
	if *existing > 0 {
		// Keys as the store derives them (a prefix and 64 hex digits),
		// settled records' size, expiring in a year.
		if _, err := pool.Exec(ctx, `INSERT INTO idemproxy.records (key, value, expires_ms)
SELECT 'idem:' || encode(sha256(i::text::bytea), 'hex'), decode(repeat('02', $2), 'hex'), (extract(epoch FROM now()) * 1000)::bigint + 31536000000
FROM generate_series(1, $1) i`, *existing, *size+300); err != nil {
			return err
		}
	}
	bytes0 := tableBytes()
	// Measured from a checkpoint, as a running server is: the first
	// change of each page after it logs the whole page.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	before := wal()
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
	afterCompletes := wal()
	bytes1 := tableBytes() // its vacuum of the claims' old versions: below
	afterFirstVacuum := wal()
	// Records expire long after they were written, checkpoints later: the
	// delete is the first change of their pages since one.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	beforeExpiry := wal()
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
	tableBytes() // the vacuum that removes the expired rows' index entries
	afterVacuum := wal()
	fmt.Fprintf(os.Stdout, "PostgreSQL store, %d keys, %d-byte answers:\n", *n, *size)
	fmt.Fprintf(os.Stdout, "  on disk per settled record (table, indexes, TOAST): %.0f bytes\n", float64(bytes1-bytes0)/float64(*n))
	var keyIndex, records int64
	if err := pool.QueryRow(ctx, "SELECT pg_relation_size('idemproxy.records_pkey'), (SELECT count(*) FROM idemproxy.records)").Scan(&keyIndex, &records); err == nil && records > 0 {
		fmt.Fprintf(os.Stdout, "  the key's index: %d pages for %d records (%.0f bytes per record)\n", keyIndex/8192, records, float64(keyIndex)/float64(records))
	}
	fmt.Fprintf(os.Stdout, "  WAL per claim: %s; per completion: %s; per expiry: %s\n",
		perKey(pg, before, afterClaims, *n), perKey(pg, afterClaims, afterCompletes, *n), perKey(pg, beforeExpiry, afterExpiry, *n))
	fmt.Fprintf(os.Stdout, "  WAL of vacuum per key: %s of the completions' old versions (no checkpoint between), %s after the expiry\n",
		perKey(pg, afterCompletes, afterFirstVacuum, *n), perKey(pg, afterExpiry, afterVacuum, *n))
	// A backend reports its counts at most once a second, and an idle one
	// within 10 s: wait for all the completions' (up to 15 s).
	var upd, hot int64
	for range 150 {
		if err := pool.QueryRow(ctx, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_catalog.pg_stat_user_tables WHERE relid = 'idemproxy.records'::regclass").Scan(&upd, &hot); err != nil || upd >= int64(*n) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stdout, "  completions that stayed HOT (on their page, no new index entry): %d of %d updates\n", hot, upd)
	return nil
}

// walAt is a position in the WAL: bytes from its start, and as the
// server prints it.
type walAt struct {
	n   int64
	lsn string
}

// perKey is the WAL written from a to b per key, and the part of it that
// were full-page images.
func perKey(pg *pgtest.Server, a, b walAt, n int) string {
	s := fmt.Sprintf("%.0f bytes", float64(b.n-a.n)/float64(n))
	if w, err := pg.WALBetween(a.lsn, b.lsn); err == nil {
		s += fmt.Sprintf(" (full-page images %.0f: %.2f of %.0f bytes each)", float64(w.FPIBytes)/float64(n), float64(w.FPIs)/float64(n), float64(w.FPIBytes)/float64(max(w.FPIs, 1)))
	}
	return s
}
