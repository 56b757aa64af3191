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
