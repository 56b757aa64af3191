package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Upgrades (issue 24): a WebSocket upgrade on an unprotected path is
// tunnelled as before; h2c (whose upstream would go on parsing HTTP in the
// tunnel, headers nobody stripped) is refused there with 400
// upgrade-refused, and every upgrade on a protected route is refused
// before any claim: a claim is never held across a 101.
func TestUpgrades(t *testing.T) {
	var reached atomic.Int64
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.Header.Get("Upgrade") == "" {
			w.WriteHeader(http.StatusOK)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", r.Header.Get("Upgrade"))
		brw.Flush()
		io.Copy(conn, brw) // echo the tunnel
	}, nil)
	send := func(path, proto string) (status int, tunnel string) {
		t.Helper()
		c, err := net.Dial("tcp", strings.TrimPrefix(e.front.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\nX-Forwarded-User: alice\r\nIdempotency-Key: up-%s\r\nContent-Length: 0\r\n\r\n", path, proto, proto)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			fmt.Fprint(c, "ping")
			b := make([]byte, 4)
			io.ReadFull(br, b)
			return resp.StatusCode, string(b)
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, ""
	}
	if status, tunnel := send("/socket", "websocket"); status != http.StatusSwitchingProtocols || tunnel != "ping" {
		t.Errorf("websocket on a pass-through path: %d %q, want 101 and the tunnel", status, tunnel)
	}
	before := reached.Load()
	if status, _ := send("/socket", "h2c"); status != http.StatusBadRequest {
		t.Errorf("h2c on a pass-through path: %d, want 400 upgrade-refused", status)
	}
	if status, _ := send("/payments", "websocket"); status != http.StatusBadRequest {
		t.Errorf("websocket on a protected route: %d, want 400 upgrade-refused", status)
	}
	if n := reached.Load() - before; n != 0 {
		t.Errorf("refused upgrades reached the upstream %d times", n)
	}
	if o := e.outcomes(); o["rejected"] != 1 || o["claimed"]+o["stored"] != 0 {
		t.Errorf("outcomes %v: the protected upgrade must be rejected before any claim", o)
	}
}
