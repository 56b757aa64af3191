// Package pgtest starts real PostgreSQL servers for tests: a cluster made
// by initdb (a copy of one: cluster.go) in a temporary directory, postgres on a free loopback port,
// stopped and removed when the test ends. PostgreSQL refuses to run as
// root, so under root (CI) both run as the postgres user, which owns the
// directory. Without PostgreSQL installed a test skips with a message, or
// fails when IDEMPROXY_REQUIRE_POSTGRES=1 (CI sets it).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
)

// RequireEnv, when "1", turns a missing PostgreSQL into a test failure
// instead of a skip.
const RequireEnv = "IDEMPROXY_REQUIRE_POSTGRES"

// User is the superuser initdb creates; it connects without a password
// (trust, on loopback only).
const User = "idemproxy"

// Server is one postgres process owned by one test.
type Server struct {
	// Addr is host:port on 127.0.0.1; URL a connection string for the
	// postgres database as User.
	Addr string
	URL  string

	tb   testing.TB
	bin  string
	dir  string
	port int
	cred *syscall.Credential
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	// env is added to postgres' environment (StartEnv: a clock shim's).
	env []string
}

// binDir is where initdb and postgres are: beside a postgres in PATH, or
// Debian's /usr/lib/postgresql/<version>/bin, the newest.
func binDir() (string, error) {
	if p, err := exec.LookPath("postgres"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return va - vb
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("no initdb and postgres found (PATH, /usr/lib/postgresql/*/bin)")
}

// Start makes a cluster and starts postgres on it, with settings (name
// value pairs, given as -c name=value) on top of the defaults, and stops
// and removes it when the test ends. Every write is durable when
// acknowledged, as in production: fsync and synchronous_commit keep their
// defaults.
func Start(tb testing.TB, settings ...string) *Server {
	tb.Helper()
	if _, err := binDir(); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%v, and %s=1: install it (apt-get install -y postgresql)", err, RequireEnv)
		}
		tb.Skipf("SKIP: %v: install PostgreSQL (apt-get install -y postgresql) to run tests against it; set %s=1 to make this a failure", err, RequireEnv)
	}
	s, err := Launch(settings...)
	if err != nil {
		tb.Fatal(err)
	}
	s.tb = tb
	tb.Cleanup(s.Close)
	return s
}

// StartEnv is Start with env added to postgres' environment (a clock
// shim's, internal/clockshim: its files must be readable by the postgres
// user).
func StartEnv(tb testing.TB, env []string, settings ...string) *Server {
	tb.Helper()
	if _, err := binDir(); err != nil {
		Start(tb) // skips or fails as Start does
	}
	s, err := launch(env, settings)
	if err != nil {
		tb.Fatal(err)
	}
	s.tb = tb
	tb.Cleanup(s.Close)
	return s
}

// Launch is Start for a harness (chaos): the caller ends it with Close.
func Launch(settings ...string) (*Server, error) { return launch(nil, settings) }

// LaunchEnv is Launch with env added to postgres' environment.
func LaunchEnv(env []string, settings ...string) (*Server, error) { return launch(env, settings) }

// launch makes and starts a cluster with env added to postgres'
// environment.
func launch(env, settings []string) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, log: &syncbuf.Buffer{}, env: env}
	if os.Geteuid() == 0 {
		if s.cred, err = postgresUser(); err != nil {
			return nil, err
		}
	}
	if err := s.makeDir("idemproxy-pg-"); err != nil {
		return nil, err
	}
	if err := s.newCluster(filepath.Join(s.dir, "data")); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	if err := s.runOnFreePort(settings); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

// makeDir makes s's directory, the postgres user's when root (not
// tb.TempDir: its parent is root's and closed to that user).
func (s *Server) makeDir(pattern string) error {
	var err error
	if s.dir, err = os.MkdirTemp("", pattern); err != nil {
		return err
	}
	if s.cred != nil {
		return os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid))
	}
	return nil
}

// runOnFreePort starts postgres on a free port, another when a parallel
// test took the one found.
func (s *Server) runOnFreePort(settings []string) error {
	var err error
	for range 5 {
		if s.port, err = loopback.FreePort(); err != nil {
			return err
		}
		if err = s.run(settings); err == nil {
			return nil
		}
		if !strings.Contains(s.log.String(), "already in use") {
			break
		}
	}
	return fmt.Errorf("postgres did not start: %v\n%s", err, s.log.String())
}

// Close stops postgres and removes its cluster.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// postgresUser is the credential of the postgres user, which Debian's
// package creates.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the postgres user to run PostgreSQL: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// run starts postgres on s.port and waits until it takes connections.
func (s *Server) run(settings []string) error {
	args := []string{"-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + s.dir}
	for i := 0; i+1 < len(settings); i += 2 {
		args = append(args, "-c", settings[i]+"="+settings[i+1])
	}
	s.cmd = exec.Command(filepath.Join(s.bin, "postgres"), args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if len(s.env) > 0 {
		s.cmd.Env = append(os.Environ(), s.env...)
	}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.URL = fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", User, s.Addr)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			s.cmd = nil
			return fmt.Errorf("postgres exited: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			conn.Close(ctx)
			cancel()
			go func() { <-exited }() // reaped when it stops
			return nil
		}
		cancel()
		time.Sleep(50 * time.Millisecond)
	}
	s.Kill()
	return errors.New("postgres took no connection within 30s")
}

// Stop shuts postgres down fast (SIGINT: connections cut, no data lost)
// and waits for it; the cluster stays for Restart.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	s.wait()
}

// Kill ends postgres with SIGKILL, as a crash would; Restart recovers the
// cluster from its WAL.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	s.wait()
}

// wait waits until the postgres process this Server started is gone.
func (s *Server) wait() {
	for range 600 {
		if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.cmd = nil
}

// Restart starts postgres again on the same cluster and port (after
// Kill, once the old server's backends are gone: postgres refuses to
// start while they hold its shared memory); it fails the test when it
// cannot.
func (s *Server) Restart(settings ...string) {
	s.tb.Helper()
	if err := s.Relaunch(settings...); err != nil {
		s.tb.Fatal(err)
	}
}

// Relaunch is Restart for a harness.
func (s *Server) Relaunch(settings ...string) error {
	s.Stop()
	var err error
	for range 20 {
		if err = s.run(settings); err == nil {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("postgres did not restart: %v\n%s", err, s.log.String())
}

// Signal sends sig to every process of the cluster (the postmaster's
// process group: its backends too): SIGSTOP and SIGCONT pause and resume
// the whole server.
func (s *Server) Signal(sig syscall.Signal) {
	if s.cmd != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	}
}

// Standby makes a streaming replica of s (pg_basebackup, as the primary
// knows it: application_name standby) and starts it on a port of its own.
// Sync then makes s wait for it on every commit.
func (s *Server) Standby(tb testing.TB) *Server { return s.StandbyNamed(tb, "standby") }

// StandbyNamed is Standby under name: the application_name the primary
// knows it by (synchronous_standby_names' names), and its own
// cluster_name, as docs/production.md asks of every server, so that once
// promoted it can tell it was the synchronous one.
func (s *Server) StandbyNamed(tb testing.TB, name string) *Server {
	tb.Helper()
	st := &Server{tb: tb, bin: s.bin, cred: s.cred, log: &syncbuf.Buffer{}}
	if err := st.makeDir("idemproxy-pg-standby-"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(st.dir) })
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", s.port, User, name)
	if err := s.basebackup(conninfo, filepath.Join(st.dir, "data"), "-R"); err != nil {
		tb.Fatal(err)
	}
	if err := st.runOnFreePort([]string{"cluster_name", name}); err != nil {
		tb.Fatalf("the standby: %v", err)
	}
	tb.Cleanup(st.Stop)
	return st
}

// basebackup copies s's cluster into dir with pg_basebackup, its WAL
// streamed with it, with more as given (-R: as a standby).
func (s *Server) basebackup(conninfo, dir string, more ...string) error {
	args := append([]string{"-d", conninfo, "-D", dir, "-X", "stream", "-c", "fast", "--no-sync"}, more...)
	backup := exec.Command(filepath.Join(s.bin, "pg_basebackup"), args...)
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup: %v\n%s", err, out)
	}
	return nil
}

// BaseBackup takes a base backup of s, as an operator's nightly job would
// (pg_basebackup, its WAL with it), and returns its directory, removed
// when the test ends.
func (s *Server) BaseBackup(tb testing.TB) string {
	tb.Helper()
	b := &Server{cred: s.cred}
	if err := b.makeDir("idemproxy-pg-backup-"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(b.dir) })
	dir := filepath.Join(b.dir, "data")
	if err := s.basebackup(fmt.Sprintf("host=127.0.0.1 port=%d user=%s", s.port, User), dir); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// RestoreBackup stops s, puts the base backup at dir in place of its data
// (as it was taken: no recovery signal, so it starts as a primary on the
// same timeline) and starts it on the same port.
func (s *Server) RestoreBackup(tb testing.TB, dir string) {
	tb.Helper()
	s.Stop()
	data := filepath.Join(s.dir, "data")
	if err := os.RemoveAll(data); err != nil {
		tb.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", dir, data).CombinedOutput(); err != nil {
		tb.Fatalf("cp: %v\n%s", err, out)
	}
	s.Restart()
}

// ResetWAL crashes s (SIGKILL), throws its WAL away as pg_resetwal -f
// does (what was committed since the last checkpoint, and not yet
// written to the data files, is gone) and starts it again.
func (s *Server) ResetWAL(tb testing.TB) {
	tb.Helper()
	s.Signal(syscall.SIGKILL) // the postmaster and its backends, as a crash ends them
	s.Kill()
	// No server runs on the cluster: its lock file stays behind, which an
	// operator deletes before pg_resetwal.
	_ = os.Remove(filepath.Join(s.dir, "data", "postmaster.pid"))
	reset := exec.Command(filepath.Join(s.bin, "pg_resetwal"), "-f", "-D", filepath.Join(s.dir, "data"))
	reset.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := reset.CombinedOutput(); err != nil {
		tb.Fatalf("pg_resetwal: %v\n%s", err, out)
	}
	s.Restart()
}

// Reinit stops s, replaces its cluster with a new one (initdb: another
// system identifier, empty) and starts that on the same port with
// settings: a restore into a new cluster starts so.
func (s *Server) Reinit(tb testing.TB, settings ...string) {
	tb.Helper()
	s.Stop()
	data := filepath.Join(s.dir, "data")
	if err := os.RemoveAll(data); err != nil {
		tb.Fatal(err)
	}
	if err := initdb(s.bin, data, s.cred); err != nil {
		tb.Fatal(err)
	}
	s.Restart(settings...)
}

// RequirePassword creates role with password and makes s ask it for the
// password (scram-sha-256) on 127.0.0.1, where every other role is
// trusted.
func (s *Server) RequirePassword(tb testing.TB, role, password string) {
	tb.Helper()
	ctx := context.Background()
	conn := s.Conn(tb)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password)); err != nil {
		tb.Fatal(err)
	}
	hba := filepath.Join(s.dir, "data", "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		tb.Fatal(err)
	}
	// Rewritten in place, so that it keeps its owner (postgres', when root).
	f, err := os.OpenFile(hba, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "host all %s 127.0.0.1/32 scram-sha-256\n%s", role, old)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		tb.Fatal(err)
	}
}

// Conn is a connection to s, closed when the test ends.
func (s *Server) Conn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), s.URL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Sync makes every commit on s wait until the standby named standby
// flushed it (synchronous_standby_names), and returns once it streams
// synchronously.
func (s *Server) Sync(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	conn := s.Conn(tb)
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = 'standby'"); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		tb.Fatal(err)
	}
	for range 200 {
		var state string
		err := conn.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'").Scan(&state)
		if err == nil && state == "sync" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatal("the standby never became synchronous")
}

// Promote makes a standby the primary, and returns once it takes writes.
func (s *Server) Promote(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	conn := s.Conn(tb)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 30)").Scan(&ok); err != nil || !ok {
		tb.Fatalf("pg_promote: %v, %v", ok, err)
	}
}

// PID is the postmaster's process id (its backends are its children).
func (s *Server) PID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Logs is what postgres wrote.
func (s *Server) Logs() string { return s.log.String() }

// WAL is what the server wrote between two WAL positions, by pg_waldump:
// its records, the bytes of those records, and the bytes of the full-page
// images among them (a page's first change after a checkpoint logs the
// whole page).
type WAL struct {
	Records, RecordBytes, FPIBytes, FPIs int64
}

// WALBetween reads the WAL between LSNs from and to (as the server prints
// them, 0/16B3F28) with pg_waldump --stats.
func (s *Server) WALBetween(from, to string) (WAL, error) {
	out, err := exec.Command(filepath.Join(s.bin, "pg_waldump"), "--stats", "-p", filepath.Join(s.dir, "data", "pg_wal"), "-s", from, "-e", to).CombinedOutput()
	if err != nil {
		return WAL{}, fmt.Errorf("pg_waldump: %v\n%s", err, out)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		// Total  N  record-size [%]  FPI-size [%]  combined [100%]
		if len(f) >= 5 && f[0] == "Total" {
			var w WAL
			if _, err := fmt.Sscan(f[1]+" "+f[2]+" "+f[4], &w.Records, &w.RecordBytes, &w.FPIBytes); err != nil {
				return WAL{}, err
			}
			// Each image is a block reference marked FPW in the records.
			recs, err := exec.Command(filepath.Join(s.bin, "pg_waldump"), "-p", filepath.Join(s.dir, "data", "pg_wal"), "-s", from, "-e", to).Output()
			w.FPIs = int64(strings.Count(string(recs), " FPW"))
			return w, err
		}
	}
	return WAL{}, fmt.Errorf("pg_waldump: no Total line in\n%s", out)
}
