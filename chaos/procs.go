package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// redisProc is a redis-server this harness started and may kill -9.
type redisProc struct {
	dir  string
	port int
	aof  bool
	// env, when set, is added to the server's environment (the clock
	// shim's, for faultRedisClockStep).
	env []string
	cmd *exec.Cmd
}

func (r *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisProc) start() error {
	args := []string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--maxmemory-policy", "noeviction", "--loglevel", "warning"}
	if r.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command("redis-server", args...)
	if len(r.env) > 0 {
		cmd.Env = append(os.Environ(), r.env...)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.cmd = cmd
	go cmd.Wait()
	c := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1, DisableIdentity: true})
	defer c.Close()
	for range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on %s did not come up", r.addr())
}

// kill ends the server with SIGKILL, by the PID this harness started.
func (r *redisProc) kill() {
	if r.cmd != nil {
		r.cmd.Process.Kill()
		r.cmd = nil
	}
	for range 100 {
		c, err := net.DialTimeout("tcp", r.addr(), 20*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// signal sends sig to the server, by the PID this harness started.
func (r *redisProc) signal(sig syscall.Signal) {
	if r.cmd != nil {
		r.cmd.Process.Signal(sig)
	}
}

// wipe deletes the data directory's files: a restart after it is a total
// loss of Redis' data.
func (r *redisProc) wipe() {
	entries, _ := os.ReadDir(r.dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(r.dir, e.Name()))
	}
}

// sidecar is one idemproxy process (internal/binarytest runs it), each
// run logging to its own file, which the checker reads.
type sidecar struct {
	*binarytest.Sidecar
	id int
	// version is "current", or the previous release's version (-mixed).
	version    string
	port       int
	adminPort  int
	logDir     string
	incarnated int
	// env is added to its environment: sidecar 0's shares the store's
	// clock (clockshim's SharedEnv).
	env []string
}

func (s *sidecar) url() string { return s.Client }

func (s *sidecar) logPath(n int) string {
	return filepath.Join(s.logDir, fmt.Sprintf("sidecar-%d.%d.log", s.id, n))
}

// start runs the sidecar once more, until it answers /healthz.
func (s *sidecar) start() error {
	s.incarnated++
	logf, err := os.Create(s.logPath(s.incarnated))
	if err != nil {
		return err
	}
	if err := s.Run(binarytest.Options{Live: true, Stderr: logf, Env: s.env}); err != nil {
		return fmt.Errorf("sidecar %d: %w", s.id, err)
	}
	return nil
}

// kill ends the process with SIGKILL: no drain, nothing settles.
func (s *sidecar) kill() { s.Kill() }

// signal sends sig to the sidecar, by the PID this harness started.
func (s *sidecar) signal(sig syscall.Signal) { s.Signal(sig) }

// writeConfig writes the sidecar's config; storeAddr is its link to the
// store: Redis', or with postgres PostgreSQL's.
func (s *sidecar) writeConfig(dir, upstream, storeAddr string, o options) (string, error) {
	strict, reconcile, stream, postgres := o.strict, o.reconcile, o.stream, o.postgres
	config := filepath.Join(dir, fmt.Sprintf("sidecar-%d.yaml", s.id))
	unknown := "keep"
	if strict {
		unknown = "fail"
	}
	late, lookup := "", ""
	if reconcile {
		// The ledger answers the execution's own status and body: the
		// checker compares reconciled answers with executions as any.
		late = "  late_answer_window: 2s\n"
		lookup = "    reconcile: {url: \"/payments/by-key/{key}\", found: [201, 500], absent: [404], timeout: 1s, absent_after: 5s}\n"
	}
	store := fmt.Sprintf("  redis:\n    addrs: [%q]\n", storeAddr)
	if postgres {
		store = fmt.Sprintf("  postgres:\n    url: \"postgres://%s@%s/postgres?sslmode=disable&connect_timeout=2\"\n", pgtest.User, storeAddr)
	}
	format, streamRoute := "", ""
	if stream {
		format = "  record_format: 4\n"
		streamRoute = "  - name: pay-stream\n    match: \"POST /payments-stream\"\n"
		if s.id%2 == 1 { // its streams stored at most once per 20 ms (coalesce.go), beside the others' one append per read
			streamRoute += "    stream_flush_interval: 20ms\n"
		}
	}
	if o.grpc { // concurrent: wait, a grpc route's default; no reconcile (refused on grpc routes)
		streamRoute += "  - name: pay-grpc\n    match: \"POST " + grpcPath + "\"\n    protocol: grpc\n    max_wait: 3s\n"
	}
	return config, os.WriteFile(config, []byte(fmt.Sprintf(`listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
upstream:
  url: %q
  timeout: 2s
%sdrain:
  timeout: 3s
store:
%s%sdefaults:
  lease: 2s
  retention: 1h
  unknown_outcome: %s
routes:
  - name: pay
    match: "POST /payments"
%s  - name: pay-wait
    match: "POST /payments-wait"
    concurrent: wait
    max_wait: 3s
%s%s`, s.port, s.adminPort, upstream, late, format, store, unknown, lookup, lookup, streamRoute)), 0o644)
}
