package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestStartKillRestart: a server takes connections, keeps what a
// committed transaction wrote across a kill -9 and a restart (recovery
// from its WAL), and runs PostgreSQL 15 or later.
func TestStartKillRestart(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil || version < 150000 {
		t.Fatalf("server_version_num = %d, %v; want PostgreSQL 15 or later", version, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('acknowledged')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	s.Kill()
	s.Restart()
	conn, err = pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != "acknowledged" {
		t.Fatalf("after kill -9 and restart: %q, %v; want the committed row", v, err)
	}
}

// TestWALBetween: the WAL of a page's first change after a checkpoint
// holds its image; a second change of the same page, before the next
// checkpoint, holds none.
func TestWALBetween(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	conn := s.Conn(t)
	if _, err := conn.Exec(ctx, "CREATE TABLE t (k int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a'); CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	lsn := func() (at string) {
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	change := func(v string) pgtest.WAL {
		from := lsn()
		if _, err := conn.Exec(ctx, "UPDATE t SET v = $1 WHERE k = 1", v); err != nil {
			t.Fatal(err)
		}
		w, err := s.WALBetween(from, lsn())
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	if first := change("b"); first.Records == 0 || first.FPIs == 0 || first.FPIBytes == 0 {
		t.Errorf("the first change after a checkpoint: %+v, want records and a page image", first)
	}
	if second := change("c"); second.Records == 0 || second.FPIs != 0 || second.FPIBytes != 0 {
		t.Errorf("a second change of the page: %+v, want records and no image", second)
	}
}
