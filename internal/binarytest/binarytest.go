// Package binarytest runs the real idemproxy binary for tests and
// harnesses: built once per process, started on a config with free
// loopback ports, ready when its /readyz answers 200, restarted, killed or
// stopped by the PID it started, its log kept; and Recorder, the upstream
// that counts executions per idempotency key. The root tests and fleet/
// use it through T; chaos/ and bench/ build through Build and run their
// sidecars through New and Run (chaos with a log file per run, bench with
// its CPU and memory read from /proc by PID); compat/ (its own module)
// takes the path of a built binary in IDEMPROXY_BINARY.
package binarytest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
)

// Package is the import path of the binary's main package.
const Package = "github.com/idemproxy/idemproxy"

// BinaryEnv names a built binary to run instead of building this tree:
// to try the tests against an earlier release.
const BinaryEnv = "IDEMPROXY_TEST_BINARY"

// ReadyTimeout bounds how long Start waits for /readyz.
const ReadyTimeout = 10 * time.Second

var (
	once    sync.Once
	path    string
	dir     string
	buildEr error
)

// Build builds the binary from pkg's source in dir (Package from any
// directory of this module, "." in another tree) into out, with the
// build tags given (the chaos harness's chaosclock).
func Build(dir, pkg, out string, tags ...string) error {
	args := []string{"build", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
	return nil
}

// Binary is this tree's binary, built once per process into a directory
// Cleanup removes (BinaryEnv overrides it).
func Binary() (string, error) {
	if bin := os.Getenv(BinaryEnv); bin != "" {
		return bin, nil
	}
	once.Do(func() {
		if dir, buildEr = os.MkdirTemp("", "idemproxy-bin-"); buildEr != nil {
			return
		}
		path = filepath.Join(dir, "idemproxy")
		buildEr = Build(moduleRoot(), Package, path)
	})
	return path, buildEr
}

// moduleRoot is the directory of this tree's go.mod: Binary builds there,
// so a test in another module (deploy/k8s/validate) builds this tree with
// this tree's go.sum.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Cleanup removes what Binary built; call it from TestMain after m.Run.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// Sidecar is one running binary.
type Sidecar struct {
	// Client and Admin are the base URLs of its two listeners.
	Client, Admin string
	// ConfigPath is the config file it runs on.
	ConfigPath string

	bin  string
	log  *syncbuf.Buffer
	mu   sync.Mutex // guards cmd
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Options are what a Sidecar may be started with besides its config.
type Options struct {
	// Env is added to the process' environment.
	Env []string
	// Args are given after -config FILE.
	Args []string
	// Live waits for /healthz instead of /readyz (a sidecar expected not
	// to become ready).
	Live bool
	// Stderr, when set, takes this run's stdout and stderr instead of
	// the Sidecar's log (Logs), and is closed when the process exits.
	Stderr io.WriteCloser
}

// Start writes yaml, with listen and admin_listen on free loopback ports
// prepended, next to a temporary file in dir, runs bin on it and waits
// until it is ready. The caller stops it (Kill, Stop).
func Start(bin, dir, yaml string, o Options) (*Sidecar, error) {
	port, err := loopback.FreePort()
	if err != nil {
		return nil, err
	}
	admin, err := loopback.FreePort()
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "idemproxy-*.yaml")
	if err != nil {
		return nil, err
	}
	full := fmt.Sprintf("listen: \"127.0.0.1:%d\"\nadmin_listen: \"127.0.0.1:%d\"\n", port, admin) + yaml
	_, err = f.WriteString(full)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	s := New(bin, f.Name(), port, admin) // CreateTemp made it 0600
	if err := s.Run(o); err != nil {
		return nil, err
	}
	return s, nil
}

// New is a Sidecar of bin on a config written by the caller, which
// listens on port and admin_listen on admin, both on 127.0.0.1; Run
// starts it.
func New(bin, configPath string, port, admin int) *Sidecar {
	return &Sidecar{
		Client:     fmt.Sprintf("http://127.0.0.1:%d", port),
		Admin:      fmt.Sprintf("http://127.0.0.1:%d", admin),
		ConfigPath: configPath,
		bin:        bin,
		log:        &syncbuf.Buffer{},
	}
}

// Run starts the process (one more run when it was killed) and waits for
// it to be ready.
func (s *Sidecar) Run(o Options) error {
	cmd := exec.Command(s.bin, append([]string{"-config", s.ConfigPath}, o.Args...)...)
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.Stderr = s.log
	if o.Stderr != nil {
		cmd.Stdout, cmd.Stderr = o.Stderr, o.Stderr
	}
	if err := cmd.Start(); err != nil {
		if o.Stderr != nil {
			o.Stderr.Close()
		}
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		if o.Stderr != nil {
			o.Stderr.Close()
		}
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	probe := s.Admin + "/readyz"
	if o.Live {
		probe = s.Admin + "/healthz"
	}
	deadline := time.Now().Add(ReadyTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("idemproxy exited before it was ready (%s):\n%s", cmd.ProcessState, s.Logs())
		default:
		}
		if resp, err := http.Get(probe); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	s.Kill()
	return fmt.Errorf("idemproxy was not ready within %s:\n%s", ReadyTimeout, s.Logs())
}

// Logs is everything the process (every run of it) wrote to stderr.
func (s *Sidecar) Logs() string { return s.log.String() }

// PID is the process' id (its last run's).
func (s *Sidecar) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

// Signal sends sig to the process this Sidecar started; nothing when it
// never ran.
func (s *Sidecar) Signal(sig os.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.cmd.Process.Signal(sig)
}

// Kill ends the process with SIGKILL, by its PID, and waits for it; it
// does nothing when the process never ran or has exited.
func (s *Sidecar) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Stop sends SIGTERM and waits up to timeout for the process to exit; it
// returns the exit error (nil for status 0), or an error after killing it
// when it did not exit in time.
func (s *Sidecar) Stop(timeout time.Duration) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		s.Kill()
		return errors.New("idemproxy did not exit within " + timeout.String() + " of SIGTERM")
	}
	if !cmd.ProcessState.Success() {
		return fmt.Errorf("idemproxy exited: %s", cmd.ProcessState)
	}
	return nil
}

// Restart kills the process and starts it again on the same config and
// ports, waiting until it is ready.
func (s *Sidecar) Restart(o Options) error {
	s.Kill()
	return s.Run(o)
}
