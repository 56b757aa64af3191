package pgstore

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Named statements. A call sent unnamed is parsed, analysed and planned by
// the server every time; prepared once per connection under a name, it is
// only bound and run: measured with pgbench, a replay's claim went from
// 25,153 to 39,791 calls/s on one server (docs/benchmarks.md). So the
// schema's calls go out named, each prepared on a connection the first
// time that connection sends it, its name a digest of its SQL (which
// names the schema and the functions' version): wherever that name is
// found it means the same statement.
//
// Behind a transaction pooler that does not carry named statements
// between server connections (PgBouncer before 1.21, or without
// max_prepared_statements, in pool_mode = transaction), the next
// statement may run on a server connection where the name was never
// prepared (SQLSTATE 26000), or the prepare may land where it already is
// (42P05). Either way the server refused the statement whole: nothing of
// it ran (in a batch, nothing of the batch committed). The store then
// sends every call unnamed from then on, says so once (OnUnnamed), and
// runs the refused operation again, unnamed: the caller sees nothing but
// one more round trip. A wake-up refused so, after its writes committed,
// is sent again unnamed (wakeAgain), so that no waiter misses it.

// statement is how sql goes out on c: named unless the store fell back
// (above); unnamed, its description is asked once per store.
func (s *Store) statement(ctx context.Context, c *pgx.Conn, sql string) (*pgconn.StatementDescription, error) {
	if s.named.Load() {
		return c.Prepare(ctx, sql, sql)
	}
	if sd, ok := s.described.Load(sql); ok {
		return sd.(*pgconn.StatementDescription), nil
	}
	sd, err := c.PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		return nil, err
	}
	s.described.Store(sql, sd)
	return sd, nil
}

// bind is sql's statement on c (statement) and args in its parameters'
// wire format.
func (s *Store) bind(ctx context.Context, c *pgx.Conn, sql string, args []any) (*pgconn.StatementDescription, [][]byte, error) {
	sd, err := s.statement(ctx, c, sql)
	if err != nil {
		return nil, nil, err
	}
	params, err := encodeArgs(c.TypeMap(), sd, args)
	return sd, params, err
}

// binaryFormat is every parameter's and result's format: binary. Only
// read (pgconn copies it into its messages), so shared.
var binaryFormat = []int16{pgtype.BinaryFormatCode}

// send queues sql, described by sd, with params on p: by name when sd is
// a named statement's.
func send(p *pgconn.Pipeline, sql string, sd *pgconn.StatementDescription, params [][]byte) {
	if sd.Name != "" {
		p.SendQueryStatement(sd, params, binaryFormat, binaryFormat)
		return
	}
	p.SendQueryParams(sql, params, sd.ParamOIDs, binaryFormat, binaryFormat)
}

// execute runs sql, described by sd, with params on pc: by name when sd
// is a named statement's.
func execute(ctx context.Context, pc *pgconn.PgConn, sql string, sd *pgconn.StatementDescription, params [][]byte) *pgconn.ResultReader {
	if sd.Name != "" {
		return pc.ExecStatement(ctx, sd, params, binaryFormat, binaryFormat)
	}
	return pc.ExecParams(ctx, sql, params, sd.ParamOIDs, binaryFormat, binaryFormat)
}

// refusedAgain runs call, and once more when the server refused a named
// statement of it that a pooler routed elsewhere: nothing of it ran, and
// the store now sends every call unnamed (unnamedAfter).
func (s *Store) refusedAgain(call func() error) error {
	named := s.named.Load()
	err := call()
	if err != nil && named && s.unnamedAfter(err) {
		err = call()
	}
	return err
}

// unnamedAfter reports whether err is the server's refusal of a named
// statement a pooler routed elsewhere (above), and if so sends every
// call unnamed from now on: the operation that got err may run again.
func (s *Store) unnamedAfter(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != "26000" && pe.Code != "42P05") {
		return false
	}
	if s.named.Swap(false) && s.onUnnamed != nil {
		s.onUnnamed(err)
	}
	return true
}

// OnUnnamed has fell called once, with the server's error, when the
// store falls back to unnamed statements (a transaction pooler between
// it and the server).
func (s *Store) OnUnnamed(fell func(error)) { s.onUnnamed = fell }

// Named reports whether the store sends its calls as named statements.
func (s *Store) Named() bool { return s.named.Load() }
