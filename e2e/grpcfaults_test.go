package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// rawH2 is a gRPC upstream written frame by frame, so that it can do what
// a real server does rarely and at its own moment: refuse a stream
// (REFUSED_STREAM, the call never seen) or reset one after executing it.
// act picks, for the nth call it sees (from 1), "refuse", "reset" (after
// the whole request arrived: executed) or "answer".
type rawH2 struct {
	addr  string
	act   func(n int) string
	mu    sync.Mutex
	calls int // HEADERS seen
	execs int // requests read whole and acted on
}

func newRawH2(t *testing.T, act func(n int) string) *rawH2 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	u := &rawH2{addr: ln.Addr().String(), act: act}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c)
		}
	}()
	return u
}

func (u *rawH2) counts() (calls, execs int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls, u.execs
}

func (u *rawH2) serve(c net.Conn) {
	defer c.Close()
	if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
		return
	}
	fr := http2.NewFramer(c, c)
	var wmu sync.Mutex // the framer writes one frame at a time
	write := func(f func() error) { wmu.Lock(); f(); wmu.Unlock() }
	write(func() error { return fr.WriteSettings() })
	actions := map[uint32]string{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				write(fr.WriteSettingsAck)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				write(func() error { return fr.WritePing(true, f.Data) })
			}
		case *http2.HeadersFrame:
			u.mu.Lock()
			u.calls++
			act := u.act(u.calls)
			u.mu.Unlock()
			id := f.StreamID
			if act == "refuse" {
				write(func() error { return fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
				continue
			}
			actions[id] = act
			if f.StreamEnded() {
				u.finish(fr, write, id, act)
			}
		case *http2.DataFrame:
			if len(f.Data()) > 0 {
				write(func() error { return fr.WriteWindowUpdate(0, uint32(len(f.Data()))) })
			}
			if act, ok := actions[f.StreamID]; ok && f.StreamEnded() {
				u.finish(fr, write, f.StreamID, act)
			}
		}
	}
}

// finish acts on a whole request: executes it, then resets or answers.
func (u *rawH2) finish(fr *http2.Framer, write func(func() error), id uint32, act string) {
	u.mu.Lock()
	u.execs++
	n := u.execs
	u.mu.Unlock()
	if act == "reset" {
		write(func() error { return fr.WriteRSTStream(id, http2.ErrCodeInternal) })
		return
	}
	block := func(fields ...string) []byte {
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		for i := 0; i+1 < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return b.Bytes()
	}
	write(func() error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block(":status", "200", "content-type", "application/grpc"), EndHeaders: true})
	})
	write(func() error { return fr.WriteData(id, false, grpcFrame(fmt.Appendf(nil, "execution %d", n))) })
	write(func() error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block("grpc-status", "0", "x-execution", fmt.Sprint(n)), EndHeaders: true, EndStream: true})
	})
}

// TestGRPCUpstreamFaults (issue 80): a call the upstream refused
// (REFUSED_STREAM: never seen) is sent again and answered, not settled as
// an unknown outcome, and one refused every time it is sent fails
// UNAVAILABLE with its key free; a call reset after the upstream executed it is an
// unknown outcome (unknown_outcome: fail, the default: UNKNOWN with
// idemproxy-problem outcome-unknown), and its retry gets that answer, not
// a second execution.
func TestGRPCUpstreamFaults(t *testing.T) {
	t.Parallel()
	binarytest.TestBinary(t)
	up := newRawH2(t, func(n int) string {
		switch {
		case n == 1, n >= 4 && n <= 6:
			return "refuse"
		case n == 3:
			return "reset"
		}
		return "answer"
	})
	sc := binarytest.T(t, fmt.Sprintf("upstream:\n  url: \"http://%s\"\nstore:\n  redis:\n    addrs: [%q]\nroutes:\n  - name: orders\n    match: \"POST /shop.v1.Orders/CreateOrder\"\n    protocol: grpc\n", up.addr, redistest.Start(t).Addr))
	const method = "/shop.v1.Orders/CreateOrder"
	refused := callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "a")), "Idempotency-Key", "refused-once")
	calls, execs := up.counts()
	if refused.status() != "0" || !bytes.Equal(refused.body, grpcFrame([]byte("execution 1"))) || calls != 2 || execs != 1 {
		t.Errorf("a refused stream: status %q (%s) body %q; the upstream saw %d calls, executed %d: want it sent again and answered once", refused.status(), refused.header.Get("Idemproxy-Problem"), refused.body, calls, execs)
	}
	reset := callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "b")), "Idempotency-Key", "reset-after")
	again := callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "b")), "Idempotency-Key", "reset-after")
	calls, execs = up.counts()
	if reset.status() != "2" || reset.header.Get("Idemproxy-Problem") != "outcome-unknown" || again.status() != "2" || again.header.Get("Idemproxy-Problem") != "outcome-unknown" || execs != 2 || calls != 3 {
		t.Errorf("a stream reset after the call executed: %q %s, retry %q %s; %d calls and %d executions in all: want UNKNOWN outcome-unknown twice and the retry never sent", reset.status(), reset.header.Get("Idemproxy-Problem"), again.status(), again.header.Get("Idemproxy-Problem"), calls, execs)
	}
	// Refused each of the three times it is sent (once, and twice again):
	// never seen, so UNAVAILABLE and the key free; the retry executes.
	refusedAll := callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "c")), "Idempotency-Key", "refused-always")
	calls, execs = up.counts()
	retried := callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "c")), "Idempotency-Key", "refused-always")
	if refusedAll.status() != "14" || refusedAll.header.Get("Idemproxy-Problem") != "upstream-unreachable" || calls != 6 || execs != 2 ||
		retried.status() != "0" || retried.header.Get("Idempotent-Replayed") == "true" {
		t.Errorf("a call refused every time: %q %s after %d calls (%d executions), its retry %q replayed %q: want UNAVAILABLE upstream-unreachable after 6 calls, then a fresh execution", refusedAll.status(), refusedAll.header.Get("Idemproxy-Problem"), calls, execs, retried.status(), retried.header.Get("Idempotent-Replayed"))
	}
}
