package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/loopback"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestRedisRefusedIsQuietAndSaysRefused (issue 79): a sidecar idle while
// its Redis refuses connections logs go-redis' failed dials at most once
// per 10 s (v0.8.0: about four lines a second), and its STORE DOWN line
// says the connection was refused, not "context deadline exceeded" (the
// health check's deadline, which ran out while every dial failed).
func TestRedisRefusedIsQuietAndSaysRefused(t *testing.T) {
	t.Parallel()
	port, err := loopback.FreePort() // nothing listens there: every dial is refused
	if err != nil {
		t.Fatal(err)
	}
	sc := binarytest.T(t, fmt.Sprintf(`upstream:
  url: "http://127.0.0.1:1"
store:
  redis:
    addrs: ["127.0.0.1:%d"]
routes:
  - name: pay
    match: "POST /payments"
`, port), binarytest.Options{Live: true}) // never ready: its store never worked
	poll.Until(t, "the STORE DOWN line", func() bool { return strings.Contains(sc.Logs(), "STORE DOWN") })
	// Idle for 12 s more: a dial fails several times a second meanwhile.
	time.Sleep(12 * time.Second)
	logs := sc.Logs()
	var down string
	dials := 0
	for line := range strings.Lines(logs) {
		switch {
		case strings.Contains(line, "STORE DOWN"):
			down = line
		case strings.Contains(line, `"component":"go-redis"`):
			dials++
		}
	}
	if !strings.Contains(down, "connection refused") || strings.Contains(down, "context deadline exceeded") {
		t.Errorf("the STORE DOWN line must say the connection was refused, not a deadline:\n%s", down)
	}
	// The first line, and at most one per 10 s after it; a margin of one.
	if dials > 3 {
		t.Errorf("%d go-redis lines in about 14 s idle with Redis refusing: want at most one per 10 s\n%s", dials, logs)
	}
}
