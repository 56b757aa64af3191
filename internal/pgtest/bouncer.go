package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
)

// Bouncer is a PgBouncer in front of a Server in transaction mode, as
// fleets run it: each transaction may go to another server connection,
// so nothing prepared by name and no LISTEN survives it.
type Bouncer struct {
	// Addr is host:port on 127.0.0.1; URL a connection string for the
	// postgres database as User, through the bouncer.
	Addr string
	URL  string

	cmd *exec.Cmd
	log *syncbuf.Buffer
}

// Bouncer starts PgBouncer (Debian's pgbouncer) in transaction mode in
// front of s, stopped when the test ends. Without it the test skips, or
// fails when IDEMPROXY_REQUIRE_POSTGRES=1.
func (s *Server) Bouncer(tb testing.TB) *Bouncer {
	tb.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, serr := os.Stat(bin); serr != nil {
			msg := "pgbouncer not found: install it (apt-get install -y pgbouncer) to run tests through a transaction pooler"
			if os.Getenv(RequireEnv) == "1" {
				tb.Fatal(msg)
			}
			tb.Skip(msg + "; set " + RequireEnv + "=1 to make this a failure")
		}
	}
	b := &Bouncer{log: &syncbuf.Buffer{}}
	dir, err := os.MkdirTemp("", "idemproxy-pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			tb.Fatal(err)
		}
	}
	for range 5 {
		port, err := loopback.FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		if err = b.run(bin, dir, s, port); err == nil {
			tb.Cleanup(b.stop)
			return b
		}
		tb.Logf("pgbouncer on port %d: %v", port, err)
	}
	tb.Fatalf("pgbouncer did not start:\n%s", b.log.String())
	return nil
}

// run writes the bouncer's config for port and starts it, waiting until
// a query goes through.
func (b *Bouncer) run(bin, dir string, s *Server, port int) error {
	users := filepath.Join(dir, "users.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	conf := fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
`, s.port, port, users)
	for name, body := range map[string]string{users: fmt.Sprintf("%q \"\"\n", User), ini: conf} {
		if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
			return err
		}
	}
	b.cmd = exec.Command(bin, ini)
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	if err := b.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	b.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	b.URL = fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", User, b.Addr)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-exited:
			b.cmd = nil
			return fmt.Errorf("pgbouncer exited: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, b.URL)
		if err == nil {
			var one int
			err = conn.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			go func() { <-exited }()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.stop()
	return errors.New("pgbouncer took no query within 20s")
}

// stop ends the bouncer (SIGTERM) and waits for it, briefly.
func (b *Bouncer) stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	for range 100 {
		if syscall.Kill(b.cmd.Process.Pid, 0) != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(b.cmd.Process.Pid, syscall.SIGKILL) // by the PID this test started; a no-op once it is gone
	b.cmd = nil
}

// Logs is what pgbouncer wrote.
func (b *Bouncer) Logs() string { return b.log.String() }
