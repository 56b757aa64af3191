package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// streamUpstream answers POST /payments with server-sent events, one per
// value sent on steps, counting executions.
type streamUpstream struct {
	*httptest.Server
	steps chan string
	calls atomic.Int64
}

func newStreamUpstream(t *testing.T) *streamUpstream {
	u := &streamUpstream{steps: make(chan string)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		u.calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		for {
			select {
			case ev, ok := <-u.steps:
				if !ok {
					return
				}
				fmt.Fprintf(w, "data: %s\n\n", ev)
				http.NewResponseController(w).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func streamConfig(upstream, redis string, format int) string {
	return payConfig(upstream, redis, fmt.Sprintf("  record_format: %d\ndefaults:\n  lease: 1s\n", format))
}

// readEvent reads one server-sent event (through its blank line).
func readEvent(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			t.Fatalf("reading an event: %q, %v", b.String(), err)
		}
		if line == "\n" {
			return b.String()
		}
	}
}

func openStream(t *testing.T, url, key string) (*http.Response, *bufio.Reader) {
	t.Helper()
	// Bounded: a stream buffered whole (the bug these tests catch)
	// fails the test instead of hanging it.
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(payRequest(url+"/payments", key, `{"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

// attachLive opens key's stream through first (the owner), has the
// upstream send ev1 and reads it while the upstream streams, attaches a
// retry through second, which reads ev1 and then ev2 live: both clients'
// readers, each past ev2.
func attachLive(t *testing.T, up *streamUpstream, first, second, key, ev1, ev2 string) (owner, attached *bufio.Reader) {
	t.Helper()
	resp, a := openStream(t, first, key)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("first: %d %v", resp.StatusCode, resp.Header)
	}
	up.steps <- ev1
	if got := readEvent(t, a); got != "data: "+ev1+"\n\n" {
		t.Fatalf("first event = %q", got)
	}
	retry, b := openStream(t, second, key)
	if retry.StatusCode != http.StatusOK || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry through another sidecar: %d %v, want 200 attached", retry.StatusCode, retry.Header)
	}
	if got := readEvent(t, b); got != "data: "+ev1+"\n\n" {
		t.Fatalf("attached retry's first event = %q", got)
	}
	up.steps <- ev2
	readEvent(t, a)
	if got := readEvent(t, b); got != "data: "+ev2+"\n\n" {
		t.Fatalf("attached retry's live event = %q", got)
	}
	return a, b
}

// Through the running binary, under record_format 4: the first event
// reaches the client while the upstream still streams; a retry through
// another sidecar attaches and follows live; the owner's sidecar killed
// mid-stream ends every reader's stream abnormally after the same prefix,
// and a retry after that gets that prefix and that end; one execution.
func TestStreamThroughTheBinary(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store
	eachStore(t, streamThroughTheBinary)
}

// streamThroughTheBinary is TestStreamThroughTheBinary on one store.
func streamThroughTheBinary(t *testing.T, config func(upstream, extra string) string) {
	up := newStreamUpstream(t)
	extra := "  record_format: 4\ndefaults:\n  lease: 1s\n"
	owner := startBinary(t, config(up.URL, extra))
	other := startBinary(t, config(up.URL, extra))

	a, b := attachLive(t, up, owner.Client, other.Client, "chat-1", "1", "2")

	owner.Kill() // SIGKILL, by the PID this test started
	if rest, err := io.ReadAll(a); err == nil {
		t.Fatalf("the killed owner's client ended normally: %q", rest)
	}
	if rest, err := io.ReadAll(b); err == nil || len(rest) != 0 {
		t.Fatalf("the attached retry after the owner was killed: %q, %v; want an abnormal end once its lease ran out", rest, err)
	}
	late, c := openStream(t, other.Client, "chat-1")
	body, err := io.ReadAll(c)
	if late.StatusCode != http.StatusOK || err == nil || string(body) != "data: 1\n\ndata: 2\n\n" {
		t.Fatalf("retry after the owner died: %d %q, %v; want the stored prefix and an abnormal end", late.StatusCode, body, err)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
	if m := scrape(t, other.Admin); !strings.Contains(m, `idemproxy_stream_attached_total{route="pay"} 1`) {
		t.Errorf("idemproxy_stream_attached_total not counted:\n%s", grepLines(m, "idemproxy_stream"))
	}
}

// Below record_format 4 a streamed answer is buffered whole (what v0.5.0
// reads), and -check says so where stream: auto is written.
func TestStreamBufferedBelowFormat4(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newStreamUpstream(t)
	s := startBinary(t, streamConfig(up.URL, srv.Addr, 3))
	done := make(chan string, 1)
	go func() {
		resp, err := http.DefaultClient.Do(payRequest(s.Client+"/payments", "chat-2", `{}`))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	up.steps <- "1"
	up.steps <- "2"
	close(up.steps)
	if got := <-done; got != "data: 1\n\ndata: 2\n\n" {
		t.Fatalf("buffered stream = %q", got)
	}
	if _, body := post(t, s.Client+"/payments", "chat-2", `{}`); body != "data: 1\n\ndata: 2\n\n" {
		t.Fatalf("replay of the buffered stream = %q", body)
	}
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte(streamConfig(up.URL, srv.Addr, 3)+"    stream: auto\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(buildBinary(t), "-config", cfg, "-check").CombinedOutput()
	if !strings.Contains(string(out), "routes[0].stream") || !strings.Contains(string(out), "record_format: 4") {
		t.Fatalf("-check on stream: auto under format 3 says:\n%s", out)
	}
}

// On a sealing store (store.encryption) a streamed answer is still relayed
// as it arrives, sealed chunk by chunk: the first event reaches the
// client while the upstream streams, a retry through another sidecar
// attaches and follows live, a retry after the end gets the same bytes,
// Redis holds none of the answer in clear text; one execution. Before
// issue 44's last part such answers were buffered whole.
func TestSealedStreamThroughTheBinary(t *testing.T) {
	t.Parallel()
	eachStoreValues(t, sealedStreamThroughTheBinary)
}

func sealedStreamThroughTheBinary(t *testing.T, config func(upstream, extra string) string, values storeValues) {
	up := newStreamUpstream(t)
	file := filepath.Join(t.TempDir(), "seal")
	if err := os.WriteFile(file, []byte(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, claim.KeySize))), 0o400); err != nil {
		t.Fatal(err)
	}
	cfg := config(up.URL, fmt.Sprintf("  record_format: 4\n  encryption:\n    key_files: [%q]\ndefaults:\n  lease: 1s\n", file))
	owner, other := startBinary(t, cfg), startBinary(t, cfg)

	a, b := attachLive(t, up, owner.Client, other.Client, "sealed-1", "secret-one", "secret-two")
	close(up.steps)
	for name, r := range map[string]*bufio.Reader{"first": a, "attached": b} {
		if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
			t.Errorf("%s client at the end: %q, %v; want a normal end", name, rest, err)
		}
	}
	late, c := openStream(t, other.Client, "sealed-1")
	if body, err := io.ReadAll(c); late.StatusCode != http.StatusOK || err != nil || string(body) != "data: secret-one\n\ndata: secret-two\n\n" {
		t.Fatalf("retry after the end: %d %q, %v", late.StatusCode, body, err)
	}
	stored := values(t)
	if len(stored) == 0 {
		t.Fatal("the store holds no value: nothing was checked")
	}
	for k, v := range stored {
		if bytes.Contains(v, []byte("secret")) || bytes.Contains(v, []byte("event-stream")) {
			t.Errorf("the store's key %s holds the answer in clear text: %q", k, v)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

// TestStreamFlushIntervalThroughTheBinary: defaults.stream_flush_interval,
// obeyed by the running binary, on both stores. At 1s, a stream's first
// event reaches its client at once (well within the interval), and 30
// events sent 5 ms apart are stored and sent in a few appends
// (idemproxy_stream_chunks_total); at 0s every event is stored on its own
// (the upstream sends each once the client read the one before, so that
// no event arrives while the last one's append runs: a loaded machine's
// slow append coalesced them, and 18 of 31 failed a bound of 20). The
// client and a retry get every event, in order, once.
func TestStreamFlushIntervalThroughTheBinary(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, config func(upstream, extra string) string) {
		for _, tc := range []struct {
			interval    string
			most, least float64 // appends
			lockstep    bool
		}{{"1s", 8, 1, false}, {"0s", 1000, 31, true}} {
			up := newStreamUpstream(t)
			sc := startBinary(t, config(up.URL, "  record_format: 4\ndefaults:\n  lease: 2s\n  stream_flush_interval: "+tc.interval+"\n"))
			key := "flush-" + tc.interval
			resp, r := openStream(t, sc.Client, key)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d", tc.interval, resp.StatusCode)
			}
			sent := time.Now()
			up.steps <- "first"
			if got := readEvent(t, r); got != "data: first\n\n" {
				t.Fatalf("%s: first event %q", tc.interval, got)
			}
			if waited := time.Since(sent); waited >= time.Second {
				t.Errorf("%s: the first event after a quiet interval took %s, want it at once", tc.interval, waited)
			}
			seen, want := "data: first\n\n", "data: first\n\n"
			if tc.lockstep {
				for i := range 30 {
					ev := "data: " + strconv.Itoa(i) + "\n\n"
					up.steps <- strconv.Itoa(i)
					if got := readEvent(t, r); got != ev {
						t.Fatalf("%s: event %d = %q", tc.interval, i, got)
					}
					seen, want = seen+ev, want+ev
				}
				close(up.steps)
			} else {
				want += feed(up, 30)
			}
			rest, err := io.ReadAll(r)
			if err != nil || seen+string(rest) != want {
				t.Fatalf("%s: the client got %q, %v; want every event once", tc.interval, rest, err)
			}
			if _, body := post(t, sc.Client+"/payments", key, `{"prompt":"hi"}`); body != want {
				t.Errorf("%s: the retry got %q, want the whole stream", tc.interval, body)
			}
			chunks := metricValue(t, scrape(t, sc.Admin), `idemproxy_stream_chunks_total{route="pay"}`)
			t.Logf("%s: %v appends for 31 events", tc.interval, chunks)
			if chunks < tc.least || chunks > tc.most {
				t.Errorf("%s: %v appends for 31 events, want %v to %v", tc.interval, chunks, tc.least, tc.most)
			}
			if n := up.calls.Load(); n != 1 {
				t.Errorf("%s: upstream executed %d times, want 1", tc.interval, n)
			}
		}
	})
}

// feed has up send n events 5 ms apart ("0", "1", ...) and end the
// stream; it returns the events as a client reads them.
func feed(up *streamUpstream, n int) string {
	want := ""
	for i := range n {
		want += "data: " + strconv.Itoa(i) + "\n\n"
	}
	go func() {
		for i := range n {
			up.steps <- strconv.Itoa(i)
			time.Sleep(5 * time.Millisecond)
		}
		close(up.steps)
	}()
	return want
}

// metricValue is the value of the series named exactly series (name and
// labels) in the metrics text m; -1 when absent.
func metricValue(t *testing.T, m, series string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(m, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	return -1
}

// TestStreamFlushIntervalReloads: stream_flush_interval changed in the
// file and reloaded (SIGHUP) applies to the streams that start after:
// the same 31-event stream takes about one append per event at 0s, and
// a few after the reload to 300ms.
func TestStreamFlushIntervalReloads(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := range 31 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			http.NewResponseController(w).Flush()
			time.Sleep(5 * time.Millisecond)
		}
	}))
	defer up.Close()
	sc := startBinary(t, payConfig(up.URL, srv.Addr, "  record_format: 4\ndefaults:\n  stream_flush_interval: 0s\n"))
	appends := func(key string) float64 {
		t.Helper()
		before := max(metricValue(t, scrape(t, sc.Admin), `idemproxy_stream_chunks_total{route="pay"}`), 0)
		resp, r := openStream(t, sc.Client, key)
		body, err := io.ReadAll(r)
		if resp.StatusCode != http.StatusOK || err != nil || !strings.HasSuffix(string(body), "data: 30\n\n") {
			t.Fatalf("%s: %d, %d bytes, %v; want the whole stream", key, resp.StatusCode, len(body), err)
		}
		return metricValue(t, scrape(t, sc.Admin), `idemproxy_stream_chunks_total{route="pay"}`) - before
	}
	if n := appends("before"); n < 20 {
		t.Fatalf("at 0s: %v appends for 31 events, want about one each", n)
	}
	if err := os.WriteFile(sc.ConfigPath, []byte(strings.Replace(readFile(t, sc.ConfigPath), "stream_flush_interval: 0s", "stream_flush_interval: 300ms", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the reload", func() bool { return strings.Contains(sc.Logs(), "config reloaded") })
	if n := appends("after"); n > 8 {
		t.Errorf("after the reload to 300ms: %v appends for 31 events, want a few", n)
	}
}

// TestStreamChunksAsRowsThroughTheBinary: on PostgreSQL under
// store.record_format: 5 the running binary stores a stream's chunks as
// rows of their own (its record holds the head only), coalesced by the
// PostgreSQL default stream_flush_interval (20ms: 31 events 5 ms apart
// take far fewer than 31 appends), and a retry replays the whole stream;
// under 4 it writes no chunk rows.
func TestStreamChunksAsRowsThroughTheBinary(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	ctx := context.Background()
	chunkRows := func() (n int) {
		if err := pg.Conn(t).QueryRow(ctx, "select count(*) from idemproxy.chunks").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		format int
		rows   bool
	}{{5, true}, {4, false}} {
		up := newStreamUpstream(t)
		sc := startBinary(t, pgConfig(up.URL, pg.URL, fmt.Sprintf("  record_format: %d\ndefaults:\n  lease: 2s\n", tc.format)))
		key := fmt.Sprintf("rows-%d", tc.format)
		before := chunkRows()
		resp, r := openStream(t, sc.Client, key)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("format %d: %d", tc.format, resp.StatusCode)
		}
		want := feed(up, 31)
		got, err := io.ReadAll(r)
		if err != nil || string(got) != want {
			t.Fatalf("format %d: the client got %q, %v", tc.format, got, err)
		}
		if _, body := post(t, sc.Client+"/payments", key, `{"prompt":"hi"}`); body != want {
			t.Errorf("format %d: the retry got %q, want the whole stream", tc.format, body)
		}
		appends := metricValue(t, scrape(t, sc.Admin), `idemproxy_stream_chunks_total{route="pay"}`)
		added := chunkRows() - before
		t.Logf("format %d: %v appends for 31 events, %d chunk rows", tc.format, appends, added)
		if appends < 1 || appends > 20 {
			t.Errorf("format %d: %v appends for 31 events 5 ms apart; want them coalesced by the 20ms default on PostgreSQL", tc.format, appends)
		}
		if tc.rows && added < 1 || !tc.rows && added != 0 {
			t.Errorf("format %d: %d chunk rows written, want them only under 5", tc.format, added)
		}
		if n := up.calls.Load(); n != 1 {
			t.Errorf("format %d: upstream executed %d times, want 1", tc.format, n)
		}
	}
}
