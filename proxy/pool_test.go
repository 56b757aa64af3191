package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

func TestBodyPoolClasses(t *testing.T) {
	for _, n := range []int{0, 1, 1023, 1024, 1025, 4096 + 512, 1 << 20, 1<<20 + 512, 1 << 24, 1<<24 + 1} {
		b := getBody(n)
		if len(b) != 0 || cap(b) < n {
			t.Errorf("getBody(%d): len %d cap %d", n, len(b), cap(b))
		}
		if n <= 1<<maxBodyClass && cap(b)&(cap(b)-1) != 0 {
			t.Errorf("getBody(%d): cap %d is not a class size", n, cap(b))
		}
		putBody(b)
	}
	// A buffer that grew to an odd size goes to the class it fills: every
	// buffer handed out afterwards still holds what was asked for.
	for _, c := range []int{1500, 3000, 70000, 1<<20 + 600} {
		putBody(make([]byte, 10, c))
	}
	for _, n := range []int{1024, 2048, 65536, 1 << 20, 1<<20 + 512} {
		for range 4 {
			if b := getBody(n); cap(b) < n || len(b) != 0 {
				t.Fatalf("getBody(%d) after odd puts: len %d cap %d", n, len(b), cap(b))
			}
		}
	}
}

func TestLentBodyStopsAtGiveBack(t *testing.T) {
	x := &exchange{h: &Handler{}, p: &protocol{}}
	buf := append(getBody(8), "12345678"...)
	x.bufs.reqBuf = buf
	b := x.bufs.lend(buf)
	p := make([]byte, 3)
	if n, err := b.Read(p); n != 3 || err != nil || string(p) != "123" {
		t.Fatalf("Read = %d, %v, %q", n, err, p[:n])
	}
	x.bufs.giveBack(&x.p.buffers)
	copy(buf[:cap(buf)], "XXXXXXXX") // the buffer now belongs to someone else
	if n, err := b.Read(p); n != 0 || !errors.Is(err, errBodyReturned) {
		t.Fatalf("Read after giveBack = %d, %v (%q); want 0, errBodyReturned", n, err, p[:n])
	}
}

// TestPooledBodiesNeverReachAnotherRequest: body buffers are pooled, so a
// buffer given back too early, or twice, would send one request's bytes
// to the upstream as part of another's. Four clients send 1 MiB bodies of
// their own byte concurrently; the upstream answers after one byte (the
// rest is still on its way, held up by small socket buffers), waits, then
// reads the rest: every byte it receives must be its own request's.
// (http.Transport itself closes the connection before an early answer's
// end reaches the proxy when the body is still being written, so the lent
// body's guard is exercised by TestLentBodyStopsAtGiveBack.)
func TestPooledBodiesNeverReachAnotherRequest(t *testing.T) {
	var foreign, own atomic.Int64
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := r.Header.Get("X-Pattern")
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Error(err)
		}
		first := make([]byte, 1)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			t.Error(err)
			return
		}
		if first[0] != want[0] {
			foreign.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "11") // complete as soon as flushed
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
		rc.Flush()
		time.Sleep(20 * time.Millisecond) // the proxy answers and gives its buffers back
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Body.Read(buf)
			for _, c := range buf[:n] {
				if c != want[0] {
					foreign.Add(1)
				} else {
					own.Add(1)
				}
			}
			if err != nil {
				return
			}
		}
	}))
	upstream.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
		return ctx
	}
	upstream.Start()
	defer upstream.Close()

	transport := NewTransport()
	dial := transport.DialContext
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err == nil {
			_ = c.(*net.TCPConn).SetWriteBuffer(4 << 10)
		}
		return c, err
	}
	srv := redistest.Start(t)
	client, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cfg := testConfig(upstream.URL)
	pay := testRoute("pay", "POST /payments")
	pay.MaxRequestBody = 2 << 20
	cfg.Routes = []Route{pay}
	h, err := New(cfg, redisstore.New(client, "t:"), Options{Transport: transport, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	defer front.Close()

	const clients, requests = 4, 6
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range requests {
				pattern := string(rune('a' + c*requests + i))
				req, _ := http.NewRequest(http.MethodPost, front.URL+"/payments", bytes.NewReader(bytes.Repeat([]byte(pattern), 1<<20)))
				req.Header.Set("X-Forwarded-User", "alice")
				req.Header.Set("Idempotency-Key", "k-"+pattern)
				req.Header.Set("X-Pattern", pattern)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					t.Errorf("request %s: status %d", pattern, resp.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	upstream.Close() // waits for the upstream's handlers to finish reading
	if foreign.Load() != 0 {
		t.Fatalf("the upstream received %d bytes of other requests' bodies (%d of its own)", foreign.Load(), own.Load())
	}
	if own.Load() == 0 {
		t.Fatal("the upstream read nothing after answering: the test exercised nothing")
	}
	t.Logf("the upstream read %d bytes of its own requests after answering, none of another's", own.Load())
}
