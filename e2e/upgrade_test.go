package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestUpgradesThroughTheBinary (issue 31): with the default config a
// WebSocket handshake on a pass-through path reaches the app, gets its 101
// and then carries bytes both ways; h2c, which is not in the default
// pass_through_upgrades, is refused 400 upgrade-refused in the top-level
// defaults.problem_body; and any Upgrade on a protected route is refused,
// WebSocket included. v0.4.0 refused every Upgrade, WebSocket included,
// and answered outside routes in problem+json whatever problem_body said
// (IDEMPROXY_TEST_BINARY=<v0.4.0 build> shows both).
func TestUpgradesThroughTheBinary(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			w.WriteHeader(http.StatusOK)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello\n")
		rw.Flush()
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprint(rw, "echo "+line)
		rw.Flush()
	}))
	defer upstream.Close()
	sc := startBinary(t, fmt.Sprintf(`upstream:
  url: %q
defaults:
  problem_body: '{"error":{"code":{{json .Code}}}}'
routes:
  - name: pay
    match: "POST /payments"
`, upstream.URL))
	addr := strings.TrimPrefix(sc.Client, "http://")

	// WebSocket on a pass-through path: 101, then bytes both ways.
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(conn, "GET /socket HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("WebSocket handshake on a pass-through path: %d %s, want 101", resp.StatusCode, b)
	}
	if hello, err := br.ReadString('\n'); err != nil || hello != "hello\n" {
		t.Fatalf("app to client after 101: %q %v", hello, err)
	}
	fmt.Fprint(conn, "ping\n")
	if echo, err := br.ReadString('\n'); err != nil || echo != "echo ping\n" {
		t.Fatalf("client to app and back: %q %v", echo, err)
	}

	for _, tc := range []struct{ name, method, path, upgrade, code string }{
		{"h2c on a pass-through path", http.MethodGet, "/socket", "h2c", "upgrade-refused"},
		{"WebSocket on a protected route", http.MethodPost, "/payments", "websocket", "upgrade-refused"},
	} {
		req, _ := http.NewRequest(tc.method, sc.Client+tc.path, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", tc.upgrade)
		req.Header.Set("X-Forwarded-User", "alice")
		req.Header.Set("Idempotency-Key", "k")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || string(b) != `{"error":{"code":"`+tc.code+`"}}` {
			t.Errorf("%s: %d %s, want 400 in the configured problem_body with code %s", tc.name, res.StatusCode, b, tc.code)
		}
	}
}
