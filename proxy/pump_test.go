package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// pumpStore is a fake store for the pump's tests: a stream's start,
// appends, end and reads are kept in memory; every other call goes to the
// store it embeds (the Handler's codec, its claim). It fails the test when
// two appends overlap, when one does not continue the stored value where
// it ends, or when the end is recorded at another length.
type pumpStore struct {
	claim.Store
	t     testing.TB
	delay time.Duration // each append's, to widen the windows turns change hands in

	mu      sync.Mutex
	left    []time.Duration // how long each append's context had left, or -1: no deadline
	ends    []time.Time     // each append's context's deadline (zero: none)
	stored  []byte
	end     claim.StreamEnd
	ended   bool
	writing atomic.Int32
}

func (f *pumpStore) StreamStart(context.Context, string, *claim.Record, time.Duration, time.Duration) (int, error) {
	return 0, nil
}

func (f *pumpStore) StreamAppend(ctx context.Context, _ string, _ claim.Token, at int, data []byte, _ time.Duration) (int, error) {
	left := time.Duration(-1)
	d, ok := ctx.Deadline()
	if ok {
		left = time.Until(d)
	}
	if f.writing.Add(1) != 1 {
		f.t.Error("two appends at once: the pump's turns overlap")
	}
	defer f.writing.Add(-1)
	time.Sleep(f.delay)
	f.mu.Lock()
	defer f.mu.Unlock()
	if at != len(f.stored) {
		f.t.Errorf("append at %d, the stored value ends at %d", at, len(f.stored))
	}
	f.left, f.ends = append(f.left, left), append(f.ends, d)
	f.stored = append(f.stored, data...)
	return len(f.stored), nil
}

func (f *pumpStore) StreamFinish(_ context.Context, _ string, _ claim.Token, end claim.StreamEnd, at int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if end == claim.StreamEnded && at != len(f.stored) {
		f.t.Errorf("ended at %d, the stored value ends at %d", at, len(f.stored))
	}
	f.end, f.ended = end, true
	return nil
}

func (f *pumpStore) StreamRead(_ context.Context, _ string, from, max int) (claim.StreamPart, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	to := min(len(f.stored), from+max)
	return claim.StreamPart{Data: bytes.Clone(f.stored[from:to]), Next: to, Len: len(f.stored), End: claim.StreamRunning}, nil
}

// pumpUpstream is a fake upstream's streamed body: what the test writes
// into w, read by one goroutine at a time, or the test fails.
type pumpUpstream struct {
	t       testing.TB
	r       io.ReadCloser
	reading atomic.Int32
}

func (u *pumpUpstream) Read(b []byte) (int, error) {
	if u.reading.Add(1) != 1 {
		u.t.Error("two goroutines read the upstream at once: the pump's turns overlap")
	}
	defer u.reading.Add(-1)
	return u.r.Read(b)
}

func (u *pumpUpstream) Close() error { return u.r.Close() }

// startPump is an owner's pump over a fake upstream (written into the
// returned writer) and store; the returned body is what its own client
// reads.
func startPump(t testing.TB, f *pumpStore) (*owner, io.ReadCloser, *io.PipeWriter) {
	t.Helper()
	pr, pw := io.Pipe()
	o, body := startPumpOn(t, f, pr)
	return o, body, pw
}

// startPumpOn is startPump over the upstream body up.
func startPumpOn(t testing.TB, f *pumpStore, up io.ReadCloser) (*owner, io.ReadCloser) {
	t.Helper()
	f.Store = embeddedStore(t, "pump:")
	cfg := testConfig("http://127.0.0.1:1")
	pay := testRoute("pay", "POST /payments")
	pay.MaxResponseBody = 8 << 20
	cfg.Routes = []Route{pay}
	h, err := New(cfg, f, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a := h.p.newFront(context.Background(), h.routes.Load().byName["pay"], "req-1").newAttempt(admittedAs{principal: "alice", key: "stream-1"})
	rec := a.newClaim(claim.Fingerprint{})
	x := &exchange{h: h, p: h.p, rt: a.rt, requestID: a.requestID, start: a.start, a: a, w: httptest.NewRecorder(), r: httptest.NewRequest(http.MethodPost, "/payments", nil)}
	x.bufs.holder = a.principal
	o := &owner{x: x, held: &holding{a: a, rec: rec}}
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		ContentLength: -1, Body: &pumpUpstream{t: t, r: up}}
	if !o.startStream(resp) {
		t.Fatal("the stream was not started")
	}
	return o, resp.Body
}

// TestPumpHandOffs: under -race, the pump's turns change hands between
// its client's Read, its background goroutine and back, while the client
// keeps up, stalls past streamTakeover, falls more than streamPending
// behind (and reads back from the store), or goes away; and the upstream
// ends or breaks off. Whatever the client does: the upstream is read by
// one goroutine at a time, every byte is stored once and in order before
// the client gets it, the client gets the stored bytes in order (all of
// them unless it went away), and wait says how the stream ended.
func TestPumpHandOffs(t *testing.T) {
	cases := []struct {
		name   string
		total  int           // bytes the upstream writes
		stall  time.Duration // the client's pause after every take
		leave  int           // the client Closes after this many bytes (0: never)
		breaks bool          // the upstream breaks off instead of ending
		delay  time.Duration // each append's
	}{
		{name: "keeps up", total: 256 << 10},
		{name: "stalls past the takeover", total: 256 << 10, stall: 3 * streamTakeover, delay: time.Millisecond},
		{name: "falls behind and reads back", total: 3 * streamPending, stall: 20 * time.Millisecond},
		{name: "goes away", total: 512 << 10, leave: 64 << 10},
		{name: "the upstream breaks off", total: 256 << 10, breaks: true, stall: streamTakeover},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &pumpStore{t: t, delay: c.delay}
			o, body, up := startPump(t, f)
			sent := make([]byte, 0, c.total)
			go func() {
				rng := rand.New(rand.NewPCG(1, uint64(c.total)))
				for i := 0; len(sent) < c.total; i++ {
					event := fmt.Appendf(nil, "id: %d\ndata: %s\n\n", i, bytes.Repeat([]byte{'a' + byte(i%26)}, rng.IntN(4096)))
					if _, err := up.Write(event); err != nil {
						return
					}
					sent = append(sent, event...)
				}
				if c.breaks {
					up.CloseWithError(errors.New("connection reset by the upstream"))
					return
				}
				up.Close()
			}()
			var got []byte
			var readErr error
			buf := make([]byte, 64<<10)
			for {
				n, err := body.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					readErr = err
					break
				}
				if c.leave > 0 && len(got) >= c.leave {
					body.Close()
					break
				}
				time.Sleep(c.stall)
			}
			how := o.stream.wait().how
			f.mu.Lock()
			defer f.mu.Unlock()
			want, wantErr := claim.StreamEnded, error(io.EOF)
			if c.breaks {
				want, wantErr = claim.StreamAborted, errStreamAborted
			}
			if how != want || !f.ended || f.end != want {
				t.Fatalf("wait %v, recorded %v (recorded: %v), want %v", how, f.end, f.ended, want)
			}
			if !bytes.Equal(f.stored, sent) {
				t.Fatalf("stored %d bytes, the upstream wrote %d: not every byte stored once, in order", len(f.stored), len(sent))
			}
			if !bytes.HasPrefix(f.stored, got) {
				t.Fatalf("the client got %d bytes that are not the stored ones in order", len(got))
			}
			if lagged := c.total > streamPending && c.stall > 0; o.stream.lagged != lagged {
				t.Fatalf("the client lagged: %v, want %v", o.stream.lagged, lagged)
			}
			if c.leave == 0 && (len(got) != len(f.stored) || readErr != wantErr) {
				t.Fatalf("the client got %d of %d stored bytes, then %v; want all of them, then %v", len(got), len(f.stored), readErr, wantErr)
			}
		})
	}
}

// events is an upstream body that has its next event ready at every
// Read, n of them, then ends.
type events struct {
	event []byte
	n     int
}

func (e *events) Read(b []byte) (int, error) {
	if e.n == 0 {
		return 0, io.EOF
	}
	e.n--
	return copy(b, e.event), nil
}

func (e *events) Close() error { return nil }

// BenchmarkPumpEvent (issue 65): what the pump costs the owner's client
// per streamed event of 200 bytes, over a store that keeps the stream in
// memory (no round trip) and an upstream whose next event is always
// ready: the read, the append's wrapping (its timed, bounded store call,
// the counters), the hand to the client and the client's take, without
// the network on either side.
func BenchmarkPumpEvent(b *testing.B) {
	f := &pumpStore{t: b}
	up := &events{event: bytes.Repeat([]byte("x"), 200), n: b.N}
	o, body := startPumpOn(b, f, up)
	buf := make([]byte, 32<<10)
	b.ReportAllocs()
	b.ResetTimer()
	for {
		if _, err := body.Read(buf); err != nil {
			break
		}
	}
	b.StopTimer()
	o.stream.wait()
}

// TestTakeoverAfterKeepingUp: a client that kept up long enough for the
// takeover timer to look only every streamLookMax, and then stops taking
// parts without going away, is still taken over: the upstream's next
// events are read and stored without it.
func TestTakeoverAfterKeepingUp(t *testing.T) {
	f := &pumpStore{t: t}
	o, body, up := startPump(t, f)
	event := []byte("data: x\n\n")
	buf := make([]byte, 4096)
	go func() { // an event every 5 ms, for 200 ms
		for range 40 {
			time.Sleep(5 * time.Millisecond)
			_, _ = up.Write(event)
		}
	}()
	for got := 0; got < 40*len(event); { // the client waits in Read for each
		n, err := body.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	o.stream.mu.Lock()
	look := o.stream.look
	o.stream.mu.Unlock()
	if look != streamLookMax {
		t.Fatalf("after 200 ms of a client in Read the timer looks every %v, want %v", look, streamLookMax)
	}
	done := make(chan struct{})
	go func() { // the client takes nothing more: only the pump's own goroutine reads
		defer close(done)
		for range 3 {
			_, _ = up.Write(event)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream was not read once the client stopped taking parts: no takeover")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.stored)
		f.mu.Unlock()
		if n == 43*len(event) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored %d bytes, want %d", n, 43*len(event))
		}
		time.Sleep(time.Millisecond)
	}
	up.Close()
	if how := o.stream.wait().how; how != claim.StreamEnded {
		t.Fatalf("the stream ended %v", how)
	}
	body.Close()
}

// TestPumpCallsBounded: the pump's appends share a context (one per
// stream, not one per event), and each still has between half of
// settleTimeout and all of it left when it starts.
func TestPumpCallsBounded(t *testing.T) {
	f := &pumpStore{t: t}
	start := time.Now()
	o, body, up := startPump(t, f)
	go func() {
		for range 200 { // a pipe: each event is one read, one append
			_, _ = up.Write([]byte("data: x\n\n"))
		}
		up.Close()
	}()
	if _, err := io.Copy(io.Discard, body); err != nil {
		t.Fatal(err)
	}
	o.stream.wait()
	elapsed := time.Since(start)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.left) == 0 {
		t.Fatal("no append")
	}
	for i, left := range f.left {
		if left < settleTimeout/2 || left > settleTimeout {
			t.Fatalf("append %d had %v left, want between %v and %v", i, left, settleTimeout/2, settleTimeout)
		}
	}
	// Shared: a context is made again only once half of settleTimeout
	// went by, so the appends saw at most one deadline per half of it
	// (a context per append gives each its own).
	deadlines := map[time.Time]bool{}
	for _, d := range f.ends {
		deadlines[d] = true
	}
	if most := 1 + int(elapsed/(settleTimeout/2)); len(deadlines) > most {
		t.Fatalf("%d appends over %v ran on %d contexts, want at most %d: one per stream, made again every %v", len(f.ends), elapsed.Round(time.Millisecond), len(deadlines), most, settleTimeout/2)
	}
}
