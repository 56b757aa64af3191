package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// countingConn counts the writes on a connection to the upstream.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A small request body reaches the upstream in the same write as the
// request's headers (issue 45: one system call less per first attempt; a
// lent body had the transport flush the headers first); a larger one is
// still lent and still arrives whole.
func TestSmallBodyForwardedInOneWrite(t *testing.T) {
	var writes atomic.Int64
	tr := proxy.NewTransport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &writes}, nil
	}
	var mu sync.Mutex
	bodies := map[string][]string{}
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies[r.Header.Get("Idempotency-Key")] = append(bodies[r.Header.Get("Idempotency-Key")], string(b))
		mu.Unlock()
		created(w, r)
	}, func(c *setup) { c.Transport = tr })
	if r := e.do(req{user: "alice", key: "warm", body: `{"amount":1}`}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	writes.Store(0)
	if r := e.do(req{user: "alice", key: "small", body: `{"amount":2}`}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("a first attempt with a 12-byte body took %d writes to the upstream, want 1 (headers and body together)", n)
	}
	big := `{"pad":"` + strings.Repeat("x", 8<<10) + `"}`
	if r := e.do(req{user: "alice", key: "big", body: big}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := bodies["big"]; len(got) != 1 || got[0] != big {
		t.Errorf("the 8 KiB body reached the upstream as %d bodies, want it whole once", len(got))
	}
}
