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
	f, err := parsePgUnits(args)
	if err != nil {
		return err
	}
	// WAL is kept for pg_waldump to read each phase's after the checkpoints.
	pg, err := pgtest.Launch(append([]string{"wal_keep_size", "8GB"}, f.settings...)...)
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
	for _, q := range f.alters {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("-alter %q: %w", q, err)
		}
	}
	u := &pgUnitsRig{f: f, pg: pg, pool: pool, s: pgstore.New(pool, "idemproxy", "idem:")}
	defer u.s.Close()
	if err := u.fill(ctx); err != nil {
		return err
	}
	at, err := u.measure(ctx)
	if err != nil {
		return err
	}
	u.report(ctx, at)
	return nil
}

// pgUnitsFlags are pgunits' settings.
type pgUnitsFlags struct {
	n, size, existing int
	settings, alters  []string
}

// parsePgUnits reads pgunits' flags.
func parsePgUnits(args []string) (pgUnitsFlags, error) {
	var f pgUnitsFlags
	fs := flag.NewFlagSet("pgunits", flag.ContinueOnError)
	fs.IntVar(&f.n, "n", 20000, "keys")
	fs.IntVar(&f.size, "response-bytes", 1024, "bytes of each stored answer's body")
	fs.IntVar(&f.existing, "existing", 0, "settled records already in the table before the measured keys (a large table's index: more pages, each logged whole on its first change after a checkpoint)")
	fs.Func("set", "a server setting, name=value (repeatable): wal_compression=lz4", func(v string) error {
		name, value, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want name=value, got %q", v)
		}
		f.settings = append(f.settings, name, value)
		return nil
	})
	fs.Func("alter", "a statement run after the schema is installed (repeatable): ALTER TABLE idemproxy.records SET (fillfactor = 80)", func(v string) error {
		f.alters = append(f.alters, v)
		return nil
	})
	return f, fs.Parse(args)
}

// pgUnitsRig is one pgunits run: its server, its store and its keys.
type pgUnitsRig struct {
	f    pgUnitsFlags
	pg   *pgtest.Server
	pool *pgxpool.Pool
	s    *pgstore.Store
	recs []*claim.Record
	keys []string
}

// wal is where the server's WAL stands now.
func (u *pgUnitsRig) wal(ctx context.Context) walAt {
	var at walAt
	u.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, pg_current_wal_lsn()::text").Scan(&at.n, &at.lsn)
	return at
}

// tableBytes vacuums the records table and returns its size, with its
// indexes and TOAST.
func (u *pgUnitsRig) tableBytes(ctx context.Context) int64 {
	var b int64
	u.pool.Exec(ctx, "VACUUM idemproxy.records")
	u.pool.QueryRow(ctx, "SELECT pg_total_relation_size('idemproxy.records')").Scan(&b)
	return b
}

// fill makes the measured keys' records, and with -existing fills the
// table first: keys as the store derives them (a prefix and 64 hex
// digits), settled records' size, expiring in a year.
func (u *pgUnitsRig) fill(ctx context.Context) error {
	u.recs, u.keys = make([]*claim.Record, u.f.n), make([]string, u.f.n)
	for i := range u.recs {
		u.recs[i] = &claim.Record{State: claim.InProgress, Created: time.Now(), RequestID: fmt.Sprintf("%032x", i)}
		u.recs[i].Token[0], u.recs[i].Token[1], u.recs[i].Fingerprint[0] = byte(i), byte(i>>8), 7
		u.keys[i] = u.s.Codec().Key("bench", "pay", fmt.Sprint(i))
	}
	if u.f.existing == 0 {
		return nil
	}
	_, err := u.pool.Exec(ctx, `INSERT INTO idemproxy.records (key, value, expires_ms)
SELECT 'idem:' || encode(sha256(i::text::bytea), 'hex'), decode(repeat('02', $2), 'hex'), (extract(epoch FROM now()) * 1000)::bigint + 31536000000
FROM generate_series(1, $1) i`, u.f.existing, u.f.size+300)
	return err
}

// pgUnitsAt are the WAL positions and table sizes between the phases.
type pgUnitsAt struct {
	bytes0, bytes1                                        int64
	before, afterClaims, afterCompletes, afterFirstVacuum walAt
	beforeExpiry, afterExpiry, afterVacuum                walAt
}

// measure runs the phases: claims and completions from a checkpoint, a
// vacuum, then (from another checkpoint) every record's expiry and its
// vacuum.
func (u *pgUnitsRig) measure(ctx context.Context) (pgUnitsAt, error) {
	var at pgUnitsAt
	at.bytes0 = u.tableBytes(ctx)
	// Measured from a checkpoint, as a running server is: the first
	// change of each page after it logs the whole page.
	if _, err := u.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return at, err
	}
	at.before = u.wal(ctx)
	if err := u.settleAll(ctx, &at); err != nil {
		return at, err
	}
	// Records expire long after they were written, checkpoints later: the
	// delete is the first change of their pages since one.
	if _, err := u.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return at, err
	}
	at.beforeExpiry = u.wal(ctx)
	time.Sleep(1100 * time.Millisecond) // every record's retention (1 s) over
	for {
		gone, err := u.s.Expire(ctx, 5000)
		if err != nil {
			return at, err
		}
		if gone == 0 {
			break
		}
	}
	at.afterExpiry = u.wal(ctx)
	u.tableBytes(ctx) // the vacuum that removes the expired rows' index entries
	at.afterVacuum = u.wal(ctx)
	return at, nil
}

// settleAll claims every key, then completes each with a 201 of
// -response-bytes, kept a second; then vacuums.
func (u *pgUnitsRig) settleAll(ctx context.Context, at *pgUnitsAt) error {
	for i, rec := range u.recs {
		if _, err := u.s.Claim(ctx, u.keys[i], rec, 10*time.Second, claim.Quota{}); err != nil {
			return err
		}
	}
	at.afterClaims = u.wal(ctx)
	body := make([]byte, u.f.size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	for i, rec := range u.recs {
		done := *rec
		done.State, done.Completed, done.Status, done.Body = claim.Completed, time.Now(), http.StatusCreated, body
		done.Header = http.Header{"Content-Type": {"application/json"}}
		if _, err := u.s.Complete(ctx, u.keys[i], &done, time.Second); err != nil {
			return err
		}
	}
	at.afterCompletes = u.wal(ctx)
	at.bytes1 = u.tableBytes(ctx) // its vacuum of the claims' old versions: below
	at.afterFirstVacuum = u.wal(ctx)
	return nil
}

// report prints what the phases cost per key.
func (u *pgUnitsRig) report(ctx context.Context, at pgUnitsAt) {
	n, pg := u.f.n, u.pg
	fmt.Fprintf(os.Stdout, "PostgreSQL store, %d keys, %d-byte answers:\n", n, u.f.size)
	fmt.Fprintf(os.Stdout, "  on disk per settled record (table, indexes, TOAST): %.0f bytes\n", float64(at.bytes1-at.bytes0)/float64(n))
	var keyIndex, records int64
	if err := u.pool.QueryRow(ctx, "SELECT pg_relation_size('idemproxy.records_pkey'), (SELECT count(*) FROM idemproxy.records)").Scan(&keyIndex, &records); err == nil && records > 0 {
		fmt.Fprintf(os.Stdout, "  the key's index: %d pages for %d records (%.0f bytes per record)\n", keyIndex/8192, records, float64(keyIndex)/float64(records))
	}
	fmt.Fprintf(os.Stdout, "  WAL per claim: %s; per completion: %s; per expiry: %s\n",
		perKey(pg, at.before, at.afterClaims, n), perKey(pg, at.afterClaims, at.afterCompletes, n), perKey(pg, at.beforeExpiry, at.afterExpiry, n))
	fmt.Fprintf(os.Stdout, "  WAL of vacuum per key: %s of the completions' old versions (no checkpoint between), %s after the expiry\n",
		perKey(pg, at.afterCompletes, at.afterFirstVacuum, n), perKey(pg, at.afterExpiry, at.afterVacuum, n))
	// A backend reports its counts at most once a second, and an idle one
	// within 10 s: wait for all the completions' (up to 15 s).
	var upd, hot int64
	for range 150 {
		if err := u.pool.QueryRow(ctx, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_catalog.pg_stat_user_tables WHERE relid = 'idemproxy.records'::regclass").Scan(&upd, &hot); err != nil || upd >= int64(n) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(os.Stdout, "  completions that stayed HOT (on their page, no new index entry): %d of %d updates\n", hot, upd)
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
