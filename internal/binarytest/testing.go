package binarytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBinary is Binary for a test: it skips when go is not in PATH, or
// under -race (the binary is not built with it: real-binary tests run in
// the plain go test pass), unless BinaryEnv names a build.
func TestBinary(tb testing.TB) string {
	tb.Helper()
	if raceEnabled && os.Getenv(BinaryEnv) == "" {
		tb.Skip("real-binary test: runs in the plain go test pass, not under -race (the binary is not built with it)")
	}
	if _, err := exec.LookPath("go"); err != nil && os.Getenv(BinaryEnv) == "" {
		tb.Skip("go not in PATH: cannot build the binary")
	}
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// T starts this tree's binary (TestBinary) on yaml for the rest of the
// test: ready when it returns, killed by its PID when the test ends.
func T(tb testing.TB, yaml string, o ...Options) *Sidecar {
	tb.Helper()
	return StartT(tb, TestBinary(tb), yaml, o...)
}

// StartT is Start for a test, on bin, stopped when the test ends.
func StartT(tb testing.TB, bin, yaml string, o ...Options) *Sidecar {
	tb.Helper()
	var opts Options
	if len(o) > 0 {
		opts = o[0]
	}
	var s *Sidecar
	var err error
	for range 3 {
		// A free port can be taken by a parallel test between finding it
		// and binding it: start again on others.
		if s, err = Start(bin, tb.TempDir(), yaml, opts); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Kill)
	return s
}

// Recorder is the upstream of a binary-level test: it counts every
// execution per Idempotency-Key and answers 201 with a JSON body naming
// the key and which execution of it this was, so that a replay of the
// wrong answer, or a second execution, shows. Handler, when set, answers
// instead (after the count).
type Recorder struct {
	*httptest.Server
	// Delay holds every answer (a concurrent retry finds the claim).
	Delay time.Duration
	// Handler, when set, writes the answer.
	Handler http.HandlerFunc

	mu    sync.Mutex
	execs map[string]int
	total int
}

// NewRecorder starts a Recorder until the test ends.
func NewRecorder(tb testing.TB) *Recorder {
	r := &Recorder{execs: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	tb.Cleanup(r.Close)
	return r
}

func (r *Recorder) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	key := req.Header.Get("Idempotency-Key")
	r.mu.Lock()
	r.execs[key]++
	r.total++
	n := r.execs[key]
	r.mu.Unlock()
	if r.Delay > 0 {
		time.Sleep(r.Delay)
	}
	if r.Handler != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
		r.Handler(w, req)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	b, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("ch_%s_%d", key, n), "key": key, "execution": n, "request": string(body)})
	w.Write(b)
}

// Executions is how often the upstream ran for key.
func (r *Recorder) Executions(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.execs[key]
}

// Total is every execution, all keys together.
func (r *Recorder) Total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// PreviousT is the previous release for a test: it skips when the release
// is not in the clone, or fails when RequirePreviousEnv is "1".
func PreviousT(tb testing.TB) Release {
	tb.Helper()
	r, err := Previous()
	switch {
	case errors.Is(err, ErrNoPrevious) && os.Getenv(RequirePreviousEnv) != "1":
		tb.Skip(err)
	case err != nil:
		tb.Fatal(err)
	}
	return r
}
