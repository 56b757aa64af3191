// Package redistest starts real redis-server processes for tests.
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/loopback"
)

// RequireEnv, when "1", turns a missing redis-server into a test failure
// instead of a skip. CI sets it.
const RequireEnv = "IDEMPROXY_REQUIRE_REDIS"

// Server is a redis-server process owned by one test.
type Server struct {
	Addr string
	t    testing.TB
	bin  string
	dir  string
	args []string
	cmd  *exec.Cmd
	// tls, when set, is how clients must connect (StartTLS).
	tls *tls.Config
	// password, when set, is what Client authenticates with.
	password string
	// env is added to the process' environment (StartEnv).
	env []string
}

// Available reports whether tests should run against a real redis-server:
// it is installed, or IDEMPROXY_REQUIRE_REDIS=1 demands it (Start then
// fails the test when it is missing).
func Available() bool {
	if os.Getenv(RequireEnv) == "1" {
		return true
	}
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// Start launches redis-server on a free loopback port with persistence off
// and stops it when the test ends. It skips the test with a clear message
// when the binary is absent, or fails it under IDEMPROXY_REQUIRE_REDIS=1.
// Extra args are passed to redis-server.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return StartEnv(t, nil, args...)
}

// StartEnv is Start with env added to the server's environment (a clock
// shim's, for example: internal/clockshim).
func StartEnv(t testing.TB, env []string, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("redis-server not found and %s=1: install it (apt-get install -y redis-server)", RequireEnv)
		}
		t.Skipf("redis-server not found: install it (apt-get install -y redis-server) to run tests against real Redis; set %s=1 to make this a failure", RequireEnv)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: args, env: env}
	var lastErr error
	for range 5 {
		port, err := loopback.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("start redis-server: %v", lastErr)
	return nil
}

func (s *Server) start() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	return s.startWith(append([]string{
		"--port", port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--loglevel", "warning",
	}, s.args...)...)
}

// startWith runs redis-server with exactly args and waits for PING.
func (s *Server) startWith(args ...string) error {
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	if len(s.env) > 0 {
		cmd.Env = append(os.Environ(), s.env...)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1, DisableIdentity: true, TLSConfig: s.tls})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			s.cmd = nil
			return fmt.Errorf("redis-server exited at start: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		// NOAUTH is an answer too: the server is up and wants a password.
		if err == nil || strings.Contains(err.Error(), "NOAUTH") {
			go func() { <-exited }()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	s.cmd = nil
	return fmt.Errorf("redis-server on %s did not answer PING within 10s", s.Addr)
}

// Stop kills the server (by its PID, which this helper started) and waits
// until its port no longer answers. Stopping twice is harmless.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	s.cmd = nil
	for range 100 {
		c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Pause stops the server with SIGSTOP (by the PID this helper started):
// it keeps its connections and its data, and reads nothing until Resume.
// A test that pauses must resume, or Stop, before it ends.
func (s *Server) Pause() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("pause: redis-server is not running")
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pause redis-server: %v", err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("resume redis-server: %v", err)
	}
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("restart redis-server: %v", err)
	}
}

// Client returns a go-redis client for the server, closed with the test.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, TLSConfig: s.tls, Password: s.password})
	s.t.Cleanup(func() { c.Close() })
	return c
}
