// Package pgstore is the PostgreSQL backend of claim: claims and settled
// responses in a table, for deployments whose keys must be durable
// (every write is committed, synchronous_commit on, before it is
// acknowledged) or kept longer than memory allows.
//
// Every operation is one statement and one round trip: a function of the
// schema this package ships (schema.sql, installed by Migrate), which
// judges leases and fences on the database's clock inside it, as the Redis
// store's scripts do on Redis' (it mirrors them one for one). Record bytes
// are claim.Codec's, the same as in Redis. Waiters are woken by NOTIFY on
// one LISTEN connection per store; the NOTIFY follows the write in the
// same round trip but never in its transaction (notify.go).
//
// It is not a library: its exported names serve the idemproxy binary and
// the repository's tests, and change between releases without notice.
package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemproxy/idemproxy/claim"
)

//go:embed schema.sql
var schemaSource string

// schemaSQL is schema.sql with the record's fields rendered
// (claim.SQLLayout): the functions name the fields they read, and the
// offsets come from the codec's one declaration.
var schemaSQL = claim.SQLLayout(schemaSource)

// Store keeps claims in PostgreSQL.
type Store struct {
	pool       *pgxpool.Pool
	codec      *claim.Codec
	schema     string // quoted
	schemaName string
	// node names the server in Health and the epoch marker.
	node   string
	clocks *claim.Clocks
	// full refuses new claims (SetFull).
	full  atomic.Bool
	watch *listener
	// migrate installs the schema on Preload (MigrateOnPreload), as
	// release.
	migrate bool
	release string
	// epochs: the marker this process last saw (CheckEpochs), when, the
	// highest watermark it saw (idem_epoch), and whether a claim's own read
	// of the marker, or a failed call, asks for a new look (EpochStart);
	// epochMu guards them.
	// checkMu serializes the looks (CheckEpochs), which hold it over
	// their store call; epochMu is held only to read or write the fields.
	checkMu      sync.Mutex
	epochMu      sync.Mutex
	epochSeen    string
	epochAt      claim.Epoch
	epochChecked time.Time
	watermark    int64
	epochStale   bool
	// epochServer is when the server last looked at started (its
	// postmaster's start, in microseconds): a claim that reads another
	// talks to another server.
	epochServer int64
	// looks counts the looks begun, looked is the number of the last one
	// that ended well: a look a caller waited for stands for its own only
	// if it began after the caller found the epoch stale (EpochStart).
	looks, looked uint64
	// lookRead, in tests, runs between a look's read and its result.
	lookRead func()
	// onForeign hears that Preload used a schema another role owns and
	// migrated, without installing into it (OnForeignSchema).
	onForeign func(error)
	onEpoch   func(claim.Epoch)
	spanAttrs []attribute.KeyValue
	// calls are the statements of the schema's functions (call), and
	// readQuery read's.
	calls     sync.Map
	readQuery string
	// wakeSQL is the wake-up statement (notify.go).
	wakeSQL string
	// named sends the schema's calls as named statements (statement);
	// described holds their descriptions, by SQL, while they go unnamed.
	named     atomic.Bool
	described sync.Map
	onUnnamed func(error)
	// notifyFailures counts the wake-ups that could not be sent.
	notifyFailures atomic.Int64
	// batch groups concurrent operations (batch.go); nil sends each
	// alone (WithPipeline(false)).
	batch *batcher
	// rows stores a stream's chunks as rows (claim.WithStreamRows).
	rows bool
	// refused, when set, is why an option this store was built with is one
	// it cannot honour: Preload returns it, before any request is served.
	refused error
}

var _ claim.Backend = (*Store)(nil)

// SchemaVersion is the version of the schema's functions this package
// calls (schema.sql: idem_v3_*); v0.8.0's are idem_v2_*, v0.7.0's the
// unversioned ones (version 1).
const SchemaVersion = 3

// fnPrefix is the name prefix of this version's functions.
var fnPrefix = "idem_v" + strconv.Itoa(SchemaVersion) + "_"

// FunctionPattern is a LIKE pattern matching the names of this version's
// functions (idem\_v3\_%).
func FunctionPattern() string { return strings.ReplaceAll(fnPrefix, "_", "\\_") + "%" }

// ErrForeignSchema means the schema exists and another role owns it: that
// role could replace idemproxy's functions under the sidecars (and run its
// own code as their role), so nothing is installed there.
var ErrForeignSchema = errors.New("pgstore: the schema is owned by another role")

// ErrCannotCreate means the schema is missing and the role may not create
// it: nothing was sent.
var ErrCannotCreate = errors.New("pgstore: the role may not create the schema")

// Installed is what Install did: the version it installed, and the
// other versions' functions it left in place (for pods of other releases
// still running during a rollout).
type Installed struct {
	Version int
	// Left names the other versions found, e.g. "1 (v0.7.0)".
	Left []string
}

// Migrate installs the schema (tables, indexes, this version's
// functions) under schema; running it again changes nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, err := Install(ctx, pool, schema, "")
	return err
}

// Install is Migrate, recording release (the binary's version) as the
// installer of this schema version, and reporting the versions it left.
// It refuses a schema another role owns (ErrForeignSchema, naming it).
func Install(ctx context.Context, pool *pgxpool.Pool, schema, release string) (Installed, error) {
	var owner, me string
	err := pool.QueryRow(ctx, "SELECT pg_catalog.pg_get_userbyid(n.nspowner)::text, current_user::text FROM pg_catalog.pg_namespace n WHERE n.nspname = $1", schema).Scan(&owner, &me)
	switch {
	case err == nil && owner != me:
		return Installed{}, fmt.Errorf("%w: schema %q belongs to role %q, not to %q (who runs this): idemproxy installs its functions only into a schema its own role owns (docs/production.md, roles)", ErrForeignSchema, schema, owner, me)
	case errors.Is(err, pgx.ErrNoRows):
		// No schema yet: a role that may not create one is told so
		// without the script's text, which the server would write to its
		// log whole with the error (600 lines a try, every try).
		var create bool
		if err := pool.QueryRow(ctx, "SELECT pg_catalog.has_database_privilege(current_user, pg_catalog.current_database(), 'CREATE'), current_user::text").Scan(&create, &me); err != nil {
			return Installed{}, fmt.Errorf("pgstore: migrate schema %q: %w", schema, err)
		}
		if !create {
			return Installed{}, fmt.Errorf("%w: schema %q does not exist, and role %q may not create it (no CREATE on the database): run idemproxy store migrate -grant %s as the role that is to own it", ErrCannotCreate, schema, me, me)
		}
	case err != nil:
		return Installed{}, fmt.Errorf("pgstore: migrate schema %q: %w", schema, err)
	}
	if release == "" {
		release = "unknown"
	}
	quoted := pgx.Identifier{schema}.Sanitize()
	sql := strings.ReplaceAll(schemaSQL, "{{schema}}.idem_", quoted+"."+fnPrefix)
	sql = strings.NewReplacer("{{schema}}", quoted, "{{version}}", strconv.Itoa(SchemaVersion), "{{release}}", strings.ReplaceAll(release, "'", "")).Replace(sql)
	if err := installScript(ctx, pool, sql); err != nil {
		return Installed{}, fmt.Errorf("pgstore: migrate schema %q: %w", schema, err)
	}
	in := Installed{Version: SchemaVersion}
	rows, err := pool.Query(ctx, "SELECT version, release FROM "+quoted+".versions WHERE version <> $1 ORDER BY version", SchemaVersion)
	if err != nil {
		return in, fmt.Errorf("pgstore: read schema versions: %w", err)
	}
	for rows.Next() {
		var v int
		var rel string
		if err := rows.Scan(&v, &rel); err != nil {
			return in, err
		}
		in.Left = append(in.Left, fmt.Sprintf("%d (%s)", v, rel))
	}
	if err := rows.Err(); err != nil {
		return in, err
	}
	var v1 bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE pronamespace = $1::regnamespace AND proname = 'idem_claim')", quoted).Scan(&v1); err == nil && v1 {
		in.Left = append([]string{"1 (v0.7.0's unversioned idem_* functions)"}, in.Left...)
	}
	return in, nil
}

// installScript runs the schema's script, again when it lost a race to
// create the schema with another installer (pods starting together on an
// empty database): the script is one transaction, and the winner's
// objects made the loser's CREATE fail (a duplicate in the catalogs);
// run again, it finds them, and waits on the versions table's lock.
func installScript(ctx context.Context, pool *pgxpool.Pool, sql string) error {
	var err error
	for range 5 {
		_, err = pool.Exec(ctx, sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || !createRace[pe.Code] {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// createRace are the SQLSTATEs of a CREATE ... IF NOT EXISTS that lost a
// race with another transaction's: unique_violation (on the catalogs),
// duplicate_schema, duplicate_table, duplicate_object.
var createRace = map[string]bool{"23505": true, "42P06": true, "42P07": true, "42710": true}

// Grant gives role what a runtime role needs on schema and no more: USAGE
// on the schema, reading and writing its tables, EXECUTE on this
// version's functions. It owns nothing and can replace nothing.
func Grant(ctx context.Context, pool *pgxpool.Pool, schema, role string) error {
	quoted, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	sql := "GRANT USAGE ON SCHEMA " + quoted + " TO " + r + ";\n" +
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + quoted + ".records, " + quoted + ".chunks, " + quoted + ".counters, " + quoted + ".markers, " + quoted + ".waiters TO " + r + ";\n" +
		"GRANT SELECT ON " + quoted + ".versions TO " + r + ";\n" +
		"DO $$ DECLARE f regprocedure; BEGIN FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p WHERE p.pronamespace = '" + strings.ReplaceAll(quoted, "'", "''") + "'::regnamespace AND p.proname LIKE '" + strings.ReplaceAll(fnPrefix, "_", "\\_") + "%' LOOP " +
		"EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, " + quoteLiteral(r) + "); END LOOP; END $$;"
	if _, err := pool.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgstore: grant %s on schema %q: %w", role, schema, err)
	}
	return nil
}

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// New returns a Store on pool, its records in schema (installed by
// Migrate), every key under prefix.
func New(pool *pgxpool.Pool, schema, prefix string, opts ...claim.Option) *Store {
	codec, o := claim.Build(prefix, opts...)
	cfg := pool.Config().ConnConfig
	node := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	s := &Store{pool: pool, codec: codec, schema: pgx.Identifier{schema}.Sanitize(), schemaName: schema, node: node}
	s.clocks = claim.NewClocks(o.Now, s.checkClocks)
	s.onEpoch, s.rows = o.OnEpoch, o.StreamRows
	if o.WaitReplicas > 0 {
		s.refused = errWaitRefused
	}
	s.readQuery = "SELECT r.cur, r.pttl, " + s.fn("idem_now") + "() FROM " + s.fn("idem_read") + "($1) r"
	s.wakeSQL = wakeSQL(s.fn("idem_wake"))
	s.watch = newListener(pool, s.schema)
	s.named.Store(true)
	if o.Pipeline {
		s.batch = newBatcher(s, min(maxInFlight, max(1, int(pool.Config().MaxConns))), o.OnBatch)
	}
	s.spanAttrs = []attribute.KeyValue{semconv.DBSystemNamePostgreSQL, semconv.DBNamespace(cfg.Database)}
	if cfg.Host != "" {
		s.spanAttrs = append(s.spanAttrs, semconv.ServerAddress(cfg.Host), semconv.ServerPort(int(cfg.Port)))
	}
	return s
}

// Codec is the store's claim.Codec.
func (s *Store) Codec() *claim.Codec { return s.codec }

// Span describes store operation op's client span: named after the
// function it calls.
func (s *Store) Span(op string) claim.Span {
	name := "SELECT idem_" + op
	return claim.Span{Name: name, Attributes: append(s.spanAttrs[:len(s.spanAttrs):len(s.spanAttrs)], semconv.DBOperationName("SELECT"))}
}

// call is the statement that calls function fn with n arguments, built
// once per function: operations run on the request's path.
func (s *Store) call(fn string, n int) string {
	k := callKey{fn, n}
	if q, ok := s.calls.Load(k); ok {
		return q.(string)
	}
	ph := make([]string, n)
	for i := range ph {
		ph[i] = "$" + strconv.Itoa(i+1)
	}
	// SELECT fn(…), not SELECT * FROM fn(…): the call is an expression,
	// with no function scan and no row materialized on the server
	// (measured: a replay's claim about 15% cheaper there). A function
	// with several OUT parameters answers one composite value, which
	// fields scans.
	q := "SELECT " + s.fn(fn) + "(" + strings.Join(ph, ", ") + ")"
	if fn == "idem_claim" {
		q = s.replayFirst(q)
	}
	s.calls.Store(k, q)
	return q
}

// fields is where a call's one result goes: dst itself for a function
// with one result, or, for one with several OUT parameters (one
// composite value), dst as the composite's fields.
func fields(dst []any) []any {
	if len(dst) < 2 {
		return dst
	}
	return []any{pgtype.CompositeFields(dst)}
}

// callKey names one of call's statements.
type callKey struct {
	fn string
	n  int
}

// fn is the schema-qualified name of one of the schema's functions, by
// its name in schema.sql (idem_claim: this version's idem_v3_claim).
func (s *Store) fn(name string) string {
	return s.schema + "." + fnPrefix + strings.TrimPrefix(name, "idem_")
}

// row runs one of the schema's functions with args and scans its result
// into dst.
func (s *Store) row(ctx context.Context, op, fn string, args []any, dst ...any) error {
	err := s.refusedAgain(func() error { return s.rowOnce(ctx, fn, args, dst) })
	if err != nil {
		return s.unavailable(op, err)
	}
	return nil
}

// rowOnce is row's call, sent once.
func (s *Store) rowOnce(ctx context.Context, fn string, args, dst []any) error {
	sql := s.call(fn, len(args))
	return s.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		sd, params, err := s.bind(ctx, c.Conn(), sql, args)
		if err != nil {
			return err
		}
		return scanRow(execute(ctx, c.Conn().PgConn(), sql, sd, params), c.Conn().TypeMap(), fields(dst))
	})
}

// do runs one operation on key, a call of fn with args scanned into dst,
// waking key's waiters after it when wake: in a batch with others
// (batch.go), or alone when coalescing is off.
func (s *Store) do(ctx context.Context, name, fn, key string, wake bool, args []any, dst ...any) error {
	return s.doCounted(ctx, name, fn, key, nil, wake, args, dst...)
}

// doCounted is do for a claim counted against its quota q (when set),
// after every call of its transaction (countQuotas).
func (s *Store) doCounted(ctx context.Context, name, fn, key string, q *quotaCall, wake bool, args []any, dst ...any) error {
	return s.doWith(ctx, &op{ctx: ctx, name: name, fn: fn, key: key, quota: q, wake: wake, args: args, dst: dst})
}

// doWith runs o, as do does.
func (s *Store) doWith(ctx context.Context, o *op) error {
	args := o.args
	if s.batch == nil {
		return s.alone(ctx, o)
	}
	for _, a := range args {
		if b, ok := a.([]byte); ok {
			o.size += len(b)
		}
	}
	return s.batch.do(o)
}

// unavailable is op's failure err as claim.Unavailable; a server that
// refused the statement whole (refusedWhole) has every connection to it
// as useless, so the pool dials again (a multi-host URL finds the new
// primary).
func (s *Store) unavailable(op string, err error) error {
	s.staleEpoch()
	if refusedWhole(err) {
		s.pool.Reset()
	}
	return claim.Unavailable(op, err)
}

// Close stops the store's LISTEN connection; the pool stays open.
func (s *Store) Close() { s.watch.close() }

// MigrateOnPreload makes Preload install or update the schema first
// (store.postgres.create_schema), recording release as its installer.
func (s *Store) MigrateOnPreload(release string) { s.migrate, s.release = true, release }

// errWaitRefused is why this store refuses claim.WithWait.
var errWaitRefused = errors.New("pgstore: claim.WithWait (store.wait_replicas) is not honoured on PostgreSQL: which standbys a commit waits for is the server's synchronous_standby_names and synchronous_commit")

// Preload installs the schema when MigrateOnPreload said so, and checks
// that it is there. It fails first when the store was built with an
// option it cannot honour.
func (s *Store) Preload(ctx context.Context) error {
	if s.refused != nil {
		return s.refused
	}
	// A schema another role owns is not installed into; with this
	// version's functions in place (its owner migrated it) it is used as
	// with create_schema: false, and the check below says whether they
	// are.
	var foreign error
	if s.migrate {
		_, err := Install(ctx, s.pool, s.schemaName, s.release)
		switch {
		case errors.Is(err, ErrForeignSchema):
			foreign = err
		case err != nil:
			return claim.Unavailable("migrate", err)
		}
	}
	var now int64
	if err := s.row(ctx, "preload", "idem_now", nil, &now); err != nil {
		var pe *pgconn.PgError
		switch {
		case foreign != nil:
			// Missing, not granted, or not reached: the call's error says which.
			return claim.Unavailable("migrate", fmt.Errorf("%w; and this role cannot call version %d of idemproxy's functions in it (%v): run idemproxy store migrate -grant of this release as its owner", foreign, SchemaVersion, err))
		case errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "3F000"): // undefined_function, invalid_schema_name
			return fmt.Errorf("%w: schema %q lacks version %d of idemproxy's functions (%s*): run idemproxy store migrate of this release with the role that owns the schema, or set store.postgres.create_schema: true where this role owns it", err, s.schemaName, SchemaVersion, fnPrefix)
		}
		return err
	}
	if foreign != nil && s.onForeign != nil {
		s.onForeign(foreign)
	}
	if s.watch.onDeaf != nil {
		s.watch.start() // listen now, so that a LISTEN that hears nothing is told at start
	}
	return nil
}

// OnForeignSchema sets used, called at each Preload that finds the
// schema owned by another role with this version's functions in place:
// the store runs on them without installing (create_schema: true as a
// runtime role).
func (s *Store) OnForeignSchema(used func(error)) { s.onForeign = used }

// SetFull sets whether new claims are refused (ErrFull).
func (s *Store) SetFull(full bool) { s.full.Store(full) }

// EvictionPolicy is "noeviction": PostgreSQL never drops a row to make
// room.
func (s *Store) EvictionPolicy(context.Context) (string, error) { return "noeviction", nil }

// Health reads the database's clock (claim.Clocks), the store's size
// (its estimated rows, and the table's bytes with its indexes and TOAST)
// and its cleanup (claim.Cleanup), by the indexes alone: no scan. The
// store watcher calls it every second, and it reclaims up to expireBatch
// expired rows as it goes (reads never see them anyway).
func (s *Store) Health(ctx context.Context) []claim.MasterHealth {
	h := claim.MasterHealth{Master: s.node}
	sent := s.clocks.Now()
	var nowMS, expired, rows, bytes int64
	var lagMS, oldestMS *int64
	q := "SELECT c.now_ms, c.expired, c.lag_ms, c.oldest_claim_ms, c.est_rows, pg_total_relation_size('" + strings.ReplaceAll(s.schema, "'", "''") + ".records') FROM " + s.fn("idem_cleanup") + "() c"
	if err := s.pool.QueryRow(ctx, q).Scan(&nowMS, &expired, &lagMS, &oldestMS, &rows, &bytes); err != nil {
		h.Err = claim.Unavailable("health", err)
		s.clocks.Note(nil, false, s.clocks.Now())
		return []claim.MasterHealth{h}
	}
	answered := s.clocks.Now()
	at := time.UnixMilli(nowMS)
	// The database read its clock between sent and answered, to the
	// millisecond.
	r := claim.ClockReading{Min: sent.Sub(at.Add(time.Millisecond)), Max: answered.Sub(at)}
	s.clocks.Note([]claim.ClockReading{r}, true, answered)
	h.Clock, h.Sized, h.Keys, h.UsedBytes = &r, true, rows, bytes
	h.Cleanup = &claim.Cleanup{Expired: expired}
	if lagMS != nil {
		h.Cleanup.Lag = time.Duration(*lagMS) * time.Millisecond
	}
	if oldestMS != nil {
		h.Cleanup.OldestClaim = time.Duration(*oldestMS) * time.Millisecond
	}
	_, _ = s.Expire(ctx, expireBatch)
	return []claim.MasterHealth{h}
}

// checkClocks measures this process' clock against the database's.
func (s *Store) checkClocks(ctx context.Context) { s.Health(ctx) }

// Since is when this store first saw name (a marker row, kept).
func (s *Store) Since(ctx context.Context, name string, now time.Time) (time.Time, error) {
	var v string
	if err := s.row(ctx, "since", "idem_marker", []any{s.codec.Prefix() + "since:" + name, strconv.FormatInt(now.UnixMilli(), 10)}, &v); err != nil {
		return time.Time{}, err
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("claim: marker since:%s: %w", name, err)
	}
	return time.UnixMilli(ms), nil
}

// Forget deletes key's record while it is in state (the key API).
func (s *Store) Forget(ctx context.Context, key string, state claim.State) error {
	var n int
	if err := s.do(ctx, "forget", "idem_forget", key, true, []any{key, int(state)}, &n); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("forget: %w", claim.ErrStateChanged)
	}
	return nil
}

// expireBatch is the most expired rows one Health call deletes: 5,000 a
// second keeps up with 5,000 new keys a second.
const expireBatch = 5000

// Expire deletes up to n expired rows, oldest first (the expiry index):
// what the store watcher runs to reclaim their space. Reads treat an
// expired row as absent whether or not it was deleted yet.
func (s *Store) Expire(ctx context.Context, n int) (int, error) {
	var gone int
	err := s.row(ctx, "expire", "idem_expire", []any{n}, &gone)
	return gone, err
}

// Import stores value under key as it is, for ttl, unless the key holds a
// live record already (which is kept): a settled record copied from
// another store (idemproxy store copy). It reports whether it wrote.
func (s *Store) Import(ctx context.Context, key string, value []byte, ttl time.Duration) (bool, error) {
	q := "INSERT INTO " + s.schema + ".records AS r (key, value, expires_ms) VALUES ($1, $2, " + s.fn("idem_now") + "() + $3) " +
		"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_ms = EXCLUDED.expires_ms WHERE r.expires_ms <= " + s.fn("idem_now") + "()"
	tag, err := s.pool.Exec(ctx, q, key, value, ttl.Milliseconds())
	if err != nil {
		return false, claim.Unavailable("import", err)
	}
	return tag.RowsAffected() == 1, nil
}
