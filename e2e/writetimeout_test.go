package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestWriteTimeoutCutsAnIdleReplay (issue 55), through the real binary: a
// retry whose client takes nothing of a 16 MiB replay is cut once
// client.write_timeout (1s) passes, and the setting reloads: at 30s, the
// same idle client, once it reads, gets the whole answer. Before, nothing
// timed such a client out.
func TestWriteTimeoutCutsAnIdleReplay(t *testing.T) {
	// Not parallel: its replays read 16 MiB within the claim's 1 s confirm
	// window, which the parallel tests' load made it miss ten times in a
	// row on a loaded machine (503 each time).
	srv := redistest.Start(t)
	// Far more than a client that reads nothing lets the loopback hold
	// (its receive buffer does not grow unread: 128 KiB, and up to 4 MiB
	// sent), and small enough for the replay's read to fit its window.
	const size = 16 << 20
	answer := strings.Repeat("x", size)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, answer)
	}))
	defer upstream.Close()
	cfg := func(timeout string) string {
		return payConfig(upstream.URL, srv.Addr, "client:\n  write_timeout: "+timeout+"\ndefaults:\n  max_response_body: 64MiB\n")
	}
	sc := startBinary(t, cfg("1s"))
	if resp, body := postAnswer(t, sc.Client+"/payments", "big", `{}`); resp.StatusCode != http.StatusCreated || len(body) != size {
		t.Fatalf("first attempt: %d, %d bytes", resp.StatusCode, len(body))
	}
	// idle sends a retry, takes nothing for 3 s, then reads what it can
	// within 10 s: how many body bytes came, and whether it ended early.
	var last *http.Response
	idle := func() (int, error) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(sc.Client, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nIdempotency-Key: big\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		time.Sleep(3 * time.Second)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return 0, err
		}
		last = resp
		if resp.StatusCode != http.StatusCreated {
			b, _ := io.ReadAll(resp.Body)
			return 0, fmt.Errorf("answered %d %s", resp.StatusCode, b)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		return int(n), err
	}
	// idleOnce is idle again while the sidecar answers 503: the replay's
	// read of the record shares the claim's round trip, bounded by the
	// confirm window (1 s), which a loaded machine's read of megabytes
	// can outlast. Nothing was replayed then.
	idleOnce := func() (n int, err error) {
		for range 10 {
			if n, err = idle(); err == nil || !strings.HasPrefix(err.Error(), "answered 503") {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		return n, err
	}
	if n, err := idleOnce(); n >= size || err == nil || strings.HasPrefix(err.Error(), "answered") {
		t.Fatalf("an idle client with client.write_timeout 1s got %d of %d bytes (%v): want it cut", n, size, err)
	}
	if err := os.WriteFile(sc.ConfigPath, []byte(strings.Replace(readFile(t, sc.ConfigPath), "write_timeout: 1s", "write_timeout: 30s", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the reload", func() bool { return strings.Contains(sc.Logs(), "config reloaded") })
	if n, err := idleOnce(); n != size || err != nil {
		t.Fatalf("an idle client after write_timeout reloaded to 30s got %d of %d bytes (%v, %v): want the whole answer", n, size, err, last.Header)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWriteTimeoutCutsSmallReplays (issue 63, low): the bound holds for
// every answer written from the store, not only those over 64 KiB. A
// client that pipelines 128 retries of a 64 KiB answer on one connection
// and reads nothing fills the sockets' buffers; the replay the sidecar is
// writing then waits, and is cut once client.write_timeout (1s) passes. A
// client that reads gets every answer. v0.7.0 wrote answers up to 64 KiB
// in one write without a deadline: its idle clients held their handler
// and answer until they read.
func TestWriteTimeoutCutsSmallReplays(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const size = 64 << 10
	answer := strings.Repeat("y", size)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, answer)
	}))
	defer upstream.Close()
	sc := startBinary(t, payConfig(upstream.URL, srv.Addr, "client:\n  write_timeout: 1s\n"))
	if resp, body := postAnswer(t, sc.Client+"/payments", "small", `{}`); resp.StatusCode != http.StatusCreated || len(body) != size {
		t.Fatalf("first attempt: %d, %d bytes", resp.StatusCode, len(body))
	}
	// 128 answers are 8 MiB: more than the sockets' buffers hold, the
	// client's receive buffer kept small (no autotuning) and the
	// sidecar's send buffer at most 4 MiB (net.ipv4.tcp_wmem), so the
	// sidecar's write of one of them waits for the client.
	const pipelined = 128
	small := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) }); err != nil {
			return err
		}
		return serr
	}}
	// retries sends pipelined retries on one connection, takes nothing
	// for wait, then reads: how many whole replays came.
	retries := func(wait time.Duration) (int, error) {
		conn, err := small.Dial("tcp", strings.TrimPrefix(sc.Client, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		go func() {
			for range pipelined {
				if _, err := fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nIdempotency-Key: small\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
					return
				}
			}
		}()
		time.Sleep(wait)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(conn)
		for whole := 0; whole < pipelined; whole++ {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return whole, err
			}
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || resp.StatusCode != http.StatusCreated || n != size {
				return whole, fmt.Errorf("replay %d: %d, %d bytes, %v", whole, resp.StatusCode, n, err)
			}
		}
		return pipelined, nil
	}
	if n, err := retries(0); n != pipelined || err != nil {
		t.Fatalf("a client that reads got %d of %d replays (%v): want all", n, pipelined, err)
	}
	if n, err := retries(3 * time.Second); n >= pipelined || err == nil {
		t.Errorf("a client that read nothing for 3s, client.write_timeout 1s: got %d of %d replays (%v), want it cut", n, pipelined, err)
	}
}

// TestWriteTimeoutCutsAStalledStreamOwner, through the real binary: the
// client of a streamed first attempt that takes nothing is cut once
// client.write_timeout (1s) passes, while the stream goes on and is
// stored whole, so that a retry gets all of it; one execution. Before,
// the owner's writes to its client carried no deadline at all (the owner
// writes through a gate that refused one): a stalled client held its
// connection and handler for as long as it stayed connected.
func TestWriteTimeoutCutsAStalledStreamOwner(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const events, size = 4096, 4 << 10
	event := "data: " + strings.Repeat("x", size-8) + "\n\n"
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for range events {
			if _, err := io.WriteString(w, event); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	}))
	defer upstream.Close()
	sc := startBinary(t, payConfig(upstream.URL, srv.Addr, "  record_format: 4\nclient:\n  write_timeout: 1s\ndefaults:\n  max_response_body: 64MiB\n")+"    stream: auto\n")
	conn, err := net.Dial("tcp", strings.TrimPrefix(sc.Client, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nIdempotency-Key: chat\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	want := strings.Repeat(event, events)
	poll.Until(t, "the stream is stored whole while its client takes nothing", func() bool {
		resp, body := postAnswer(t, sc.Client+"/payments", "chat", `{}`)
		return resp.StatusCode == http.StatusOK && resp.Header.Get("Idempotent-Replayed") == "true" && body == want
	})
	time.Sleep(2 * time.Second) // past client.write_timeout, counted from a write that is still waiting
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err == nil && string(body) == want {
		t.Fatalf("the stalled owner's client got the whole stream (%d bytes) and a normal end: it was never cut", len(body))
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}
