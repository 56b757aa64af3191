package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

// raw sends bytes on a fresh connection and returns the response's status
// line and whole response, or "" if the server closed without answering.
func raw(t *testing.T, e *env, request string, pause time.Duration, rest string) (status int, resp string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	if pause > 0 {
		time.Sleep(pause)
		conn.Write([]byte(rest))
	}
	r, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, ""
	}
	defer r.Body.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s\n", r.StatusCode, r.Header.Get("Content-Type"))
	buf := make([]byte, 4096)
	n, _ := r.Body.Read(buf)
	b.Write(buf[:n])
	return r.StatusCode, b.String()
}

// noClaims asserts nothing was forwarded and no claim was left behind.
func noClaims(t *testing.T, e *env, what string) {
	t.Helper()
	if keys, _ := e.rdb.Keys(context.Background(), e.prefix+"*").Result(); len(keys) != 0 {
		t.Errorf("%s left %d claims in Redis", what, len(keys))
	}
	if n := e.ledger.Total(); n != 0 {
		t.Errorf("%s reached the upstream %d times", what, n)
	}
}

func TestHostileInput(t *testing.T) {
	e := newEnv(t, created, func(c *setup) { c.Routes[0].MaxRequestBody = 1 << 10 })
	head := "POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\n"
	for _, tc := range []struct {
		name, request string
		pause         time.Duration
		rest          string
		status        int
		problem       string
	}{
		{"absurd Content-Length", head + "Idempotency-Key: k\r\nContent-Length: 999999999999999999\r\n\r\n{}", 0, "", 413, "body-too-large"},
		{"slow-loris body", head + "Idempotency-Key: k\r\nContent-Length: 100\r\n\r\n{\"a\":", time.Second, "1}", 400, "body-unreadable"},
		{"space in key", head + "Idempotency-Key: a b\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "key-malformed"},
		{"non-ASCII key", head + "Idempotency-Key: cl\xc3\xa9\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "key-malformed"},
		{"key header twice", head + "Idempotency-Key: a\r\nIdempotency-Key: b\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "key-malformed"},
		{"identity header twice", "POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nX-Forwarded-User: bob\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "identity-invalid"},
		{"identity header under another spelling", head + "X_Forwarded_User: bob\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "identity-invalid"},
		{"identity header in lower case with an underscore", head + "x-forwarded_user: bob\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "identity-invalid"},
		{"key header under another spelling", head + "Idempotency-Key: a\r\nIDEMPOTENCY_KEY: b\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "key-malformed"},
		{"Connection nominates the key", head + "Idempotency-Key: k\r\nConnection: Idempotency-Key\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "hop-by-hop-forbidden"},
		{"dot segments in a protected path", "POST /x/../payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nIdempotency-Key: k\r\nContent-Length: 2\r\n\r\n{}", 0, "", 400, "path-not-canonical"},
		{"chunked body past the cap", head + "Idempotency-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + strings.Repeat("a", 0x800) + "\r\n0\r\n\r\n", 0, "", 413, "body-too-large"},
		{"malformed chunking", head + "Idempotency-Key: k\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, "", 400, "body-unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := raw(t, e, tc.request, tc.pause, tc.rest)
			if status != tc.status || !strings.Contains(resp, "application/problem+json") || !strings.Contains(resp, tc.problem) {
				t.Errorf("got %d %q, want %d %s problem", status, resp, tc.status, tc.problem)
			}
			noClaims(t, e, tc.name)
		})
	}
	// Oversized headers and a header key control character are refused by
	// net/http itself before idemproxy runs: still an answer, still nothing
	// claimed.
	status, _ := raw(t, e, head+"Idempotency-Key: k\r\nX-Big: "+strings.Repeat("a", 100<<10)+"\r\nContent-Length: 2\r\n\r\n{}", 0, "")
	if status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("100 KiB header: %d, want 431", status)
	}
	for _, c := range []string{"\x01", "\x7f"} {
		status, _ = raw(t, e, head+"Idempotency-Key: a"+c+"b\r\nContent-Length: 2\r\n\r\n{}", 0, "")
		if status != http.StatusBadRequest {
			t.Errorf("control character %q in the key: %d, want 400", c, status)
		}
	}
	noClaims(t, e, "headers refused by net/http")
	// The process still serves.
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusCreated {
		t.Fatalf("after the hostile requests: %d", r.status)
	}
}

func TestInvalidJSONWithIgnoredFields(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].IgnoreJSONFields = []string{"/nonce"}
	})
	first := e.do(req{user: "alice", key: "k", body: `{"amount":1,"nonce":`})
	again := e.do(req{user: "alice", key: "k", body: `{"amount":1,"nonce":`})
	other := e.do(req{user: "alice", key: "k", body: `{"amount":2,"nonce":`})
	if first.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || other.status != http.StatusUnprocessableEntity {
		t.Fatalf("invalid JSON: %d, then %d (replayed %q), then %d; want forwarded (the upstream judges it), a replay, a 422",
			first.status, again.status, again.header.Get("Idempotent-Replayed"), other.status)
	}
}

func TestForeignRecordUnderOurPrefix(t *testing.T) {
	e := newEnv(t, created, nil)
	key := e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k")
	rdb := e.rdb
	if err := rdb.Set(context.Background(), key, "not ours", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := e.do(req{user: "alice", key: "k", body: `{}`})
	if r.status != http.StatusInternalServerError || !strings.Contains(r.body, "record-unreadable") {
		t.Fatalf("foreign record: %d %s, want 500 record-unreadable", r.status, r.body)
	}
	if v, _ := rdb.Get(context.Background(), key).Result(); v != "not ours" || e.ledger.Total() != 0 {
		t.Fatalf("foreign record changed to %q or request forwarded (%d)", v, e.ledger.Total())
	}
	e.quiesce()
	if o := e.outcomes(); o["record_unreadable"] != 1 || o["store_error"] != 0 {
		t.Fatalf("outcomes %v, want record_unreadable 1 and store_error 0", o)
	}
}

func TestRedisOutOfMemory(t *testing.T) {
	// A full noeviction Redis answers OOM to every write.
	full := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
	rdb := full.Client()
	ctx := context.Background()
	// Fill with ever smaller values until even a small write is refused:
	// Redis only refuses writes while it is over maxmemory.
	i := 0
	for _, size := range []int{64 << 10, 4 << 10, 256, 16} {
		junk := strings.Repeat("x", size)
		for ; ; i++ {
			err := rdb.Set(ctx, fmt.Sprintf("junk:%d", i), junk, 0).Err()
			if err != nil {
				if !strings.Contains(err.Error(), "OOM") {
					t.Fatalf("filling Redis: %v", err)
				}
				break
			}
			if i > 1_000_000 {
				t.Fatal("Redis never filled up")
			}
		}
	}
	e2 := newEnvOn(t, full, created, nil)
	r := e2.do(req{user: "alice", key: "k", body: `{}`})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "store-unavailable") || r.header.Get("Retry-After") == "" {
		t.Fatalf("Redis OOM: %d %s, want 503 store-unavailable with Retry-After", r.status, r.body)
	}
	if e2.ledger.Total() != 0 {
		t.Fatal("forwarded although the claim could not be written")
	}
}
