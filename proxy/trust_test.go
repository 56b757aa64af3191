package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/proxy"
)

// cgiName is the name a CGI-style server (wsgiref, gunicorn before 22,
// Puma before 6.4.3, Unicorn, PHP) gives a request header: X-Forwarded-User
// and X_Forwarded_User both become HTTP_X_FORWARDED_USER.
func cgiName(h string) string {
	return "HTTP_" + strings.ToUpper(strings.ReplaceAll(h, "-", "_"))
}

// cgiValues is what such a server hands the app for the CGI name of h.
func cgiValues(seen http.Header, h string) []string {
	var out []string
	for name, vs := range seen {
		if cgiName(name) == cgiName(h) {
			out = append(out, vs...)
		}
	}
	return out
}

// send makes a request with header names written exactly as given, which
// Go's client sends as they are.
func (e *env) send(method, path string, headers map[string]string, body string) resp {
	e.t.Helper()
	hr, err := http.NewRequest(method, e.front.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range headers {
		hr.Header[k] = append(hr.Header[k], v)
	}
	hresp, err := e.front.Client().Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer hresp.Body.Close()
	b, _ := io.ReadAll(hresp.Body)
	return resp{status: hresp.StatusCode, header: hresp.Header, body: string(b)}
}

// Finding 1 and 7: from an untrusted peer, no spelling of the identity
// header, and none of the trust-bearing headers, reaches the upstream, on
// unprotected routes, optional routes without a key, and protected ones.
func TestUntrustedSpellingsNeverReachTheUpstream(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		untrusted(c)
		c.Routes = append(c.Routes, route("opt", "POST /optional"))
		c.Routes[1].RequireKey = false
	})
	spoofs := []string{"X_Forwarded_User", "X-Forwarded_User", "x_forwarded-user", "X-FORWARDED-USER"}
	trustBearing := []string{"X-Real-Ip", "X_Real_Ip", "True-Client-Ip", "X-Forwarded-Host", "x_forwarded_client_cert"}
	for _, path := range []string{"/anything", "/optional"} {
		for _, name := range append(spoofs, trustBearing...) {
			e.send(http.MethodPost, path, map[string]string{name: "victim"}, `{}`)
			seen := e.ledger.Last()
			for _, h := range []string{"X-Forwarded-User", "X-Real-Ip", "True-Client-Ip", "X-Forwarded-Host", "X-Forwarded-Client-Cert"} {
				// X-Forwarded-Host is idemproxy's own (the Host it got); no
				// value the client sent may remain.
				if vs := cgiValues(seen, h); slices.Contains(vs, "victim") {
					t.Errorf("%s with %s: the upstream reads %s = %q", path, name, cgiName(h), vs)
				}
			}
		}
	}
}

// From a trusted peer the trust-bearing headers pass; the identity header
// under another spelling, or twice, is refused on every route (finding 5).
func TestTrustedPeerAmbiguousIdentityIsRefused(t *testing.T) {
	e := newEnv(t, created, nil)
	e.send(http.MethodGet, "/anything", map[string]string{"X-Real-Ip": "203.0.113.9", "X-Forwarded-User": "alice"}, "")
	if got := cgiValues(e.ledger.Last(), "X-Real-Ip"); len(got) != 1 || got[0] != "203.0.113.9" {
		t.Errorf("X-Real-Ip from a trusted peer = %q, want it passed", got)
	}
	before := e.ledger.Total()
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
	}{
		{"variant, unprotected", "/anything", map[string]string{"X-Forwarded-User": "alice", "X_Forwarded_User": "victim"}},
		{"variant alone, unprotected", "/anything", map[string]string{"X_Forwarded_User": "victim"}},
		{"variant, protected", "/payments", map[string]string{"X-Forwarded-User": "alice", "X-Forwarded_User": "victim", "Idempotency-Key": "k"}},
		{"twice, unprotected", "/anything", map[string]string{"X-Forwarded-User": "alice", "x-forwarded-user": "victim"}},
	} {
		r := e.send(http.MethodPost, tc.path, tc.headers, `{}`)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "identity-invalid") {
			t.Errorf("%s: %d %s, want 400 identity-invalid", tc.name, r.status, r.body)
		}
	}
	if n := e.ledger.Total(); n != before {
		t.Errorf("refused requests reached the upstream %d times", n-before)
	}
}

// The key header is matched the same way: a second spelling of it on a
// protected route is refused, not claimed under one and executed under the
// other.
func TestKeyHeaderSpellingIsRefused(t *testing.T) {
	e := newEnv(t, created, nil)
	r := e.send(http.MethodPost, "/payments", map[string]string{"X-Forwarded-User": "alice", "Idempotency-Key": "a", "Idempotency_Key": "b"}, `{}`)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "key-malformed") {
		t.Fatalf("two spellings of the key: %d %s, want 400 key-malformed", r.status, r.body)
	}
	noClaims(t, e, "a key sent under two spellings")
}

// Finding 2: Connection may not nominate the identity or key header (nor
// the forwarding headers): ReverseProxy would strip them after idemproxy
// claimed the key under them.
func TestConnectionNominationIsRefused(t *testing.T) {
	e := newEnv(t, created, nil)
	for _, conn := range []string{"Idempotency-Key, X-Forwarded-User", "keep-alive, x_forwarded_user", "X-Request-Id", "idempotency_key"} {
		r := e.send(http.MethodPost, "/payments", map[string]string{"X-Forwarded-User": "alice", "Idempotency-Key": "k", "Connection": conn}, `{}`)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "hop-by-hop-forbidden") {
			t.Errorf("Connection: %s: %d %s, want 400 hop-by-hop-forbidden", conn, r.status, r.body)
		}
	}
	if r := e.send(http.MethodGet, "/anything", map[string]string{"X-Forwarded-User": "alice", "Connection": "X-Forwarded-User"}, ""); r.status != http.StatusBadRequest {
		t.Errorf("nominated identity on an unprotected route: %d, want 400", r.status)
	}
	noClaims(t, e, "nominated headers")
	if r := e.send(http.MethodPost, "/payments", map[string]string{"X-Forwarded-User": "alice", "Idempotency-Key": "k", "Connection": "keep-alive"}, `{}`); r.status != http.StatusCreated {
		t.Errorf("Connection: keep-alive: %d, want 201", r.status)
	}
}

// Finding 3: request trailers never reach the upstream of a protected
// route; the identity header in a trailer never reaches any.
func TestRequestTrailersAreNotForwarded(t *testing.T) {
	var mu sync.Mutex
	var trailers []http.Header
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		trailers = append(trailers, r.Trailer.Clone())
		mu.Unlock()
		created(w, r)
	}, nil)
	for _, path := range []string{"/payments", "/anything"} {
		req := "POST " + path + " HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nIdempotency-Key: tr-" + path[1:] + "\r\n" +
			"Transfer-Encoding: chunked\r\nTrailer: X-Forwarded-User\r\n\r\n2\r\n{}\r\n0\r\nX-Forwarded-User: victim\r\n\r\n"
		if status, body := raw(t, e, req, 0, ""); status != http.StatusCreated {
			t.Fatalf("%s with a trailer: %d %s", path, status, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, tr := range trailers {
		if vs := cgiValues(tr, "X-Forwarded-User"); len(vs) != 0 {
			t.Errorf("request %d: the upstream got the trailer X-Forwarded-User = %q", i, vs)
		}
	}
}

// Finding 4: a protected request is answered only for the path it was
// matched and fingerprinted on. /refunds/..%2Fpayments is refused, so a
// later POST /payments with the same key executes instead of replaying it.
func TestPathConfusionIsRefused(t *testing.T) {
	e := newEnv(t, created, func(c *setup) { c.Routes = append(c.Routes, route("refunds", "POST /refunds")) })
	for _, path := range []string{"/refunds/..%2Fpayments", "/refunds/../payments", "//payments", "/payments/", "/x/%2E%2E/payments"} {
		r := e.do(req{path: path, user: "alice", key: "confused", body: `{"amount":1}`})
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "path-not-canonical") {
			t.Errorf("%s: %d %s, want 400 path-not-canonical", path, r.status, r.body)
		}
	}
	noClaims(t, e, "non-canonical paths")
	r := e.do(req{user: "alice", key: "confused", body: `{"amount":1}`})
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("POST /payments after the refused variants: %d replayed=%q, want a first execution", r.status, r.header.Get("Idempotent-Replayed"))
	}
	// Percent-encoding that decodes to the canonical path is the same
	// request: it is protected, and replays.
	r = e.do(req{path: "/pay%6Dents", user: "alice", key: "confused", body: `{"amount":1}`})
	if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("POST /pay%%6Dents: %d replayed=%q, want the replay", r.status, r.header.Get("Idempotent-Replayed"))
	}
}

// Finding 6: a pass-through request that declares a body and stalls is
// cut off after the body timeout (500ms in these tests) instead of holding
// an upstream connection for as long as the client likes.
func TestStalledPassThroughBodyIsCutOff(t *testing.T) {
	got := make(chan int, 1)
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body) // what the upstream received before the cut
		got <- len(b)
	}, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("POST /anything HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"))
	n := -1
	poll.Until(t, "the upstream's read of the stalled body ends", func() bool {
		select {
		case n = <-got:
			return true
		default:
			return false
		}
	})
	if n >= 100 {
		t.Fatalf("the upstream read %d bytes of a body the client stopped sending after 10", n)
	}
}

// Issue 13, memory: clients declaring large bodies and trickling them hold
// only what they sent, and never more than limits.max_buffered_bytes in
// total; beyond it they get 503 buffers-full before any claim.
func TestSlowBodiesStayWithinTheBufferBudget(t *testing.T) {
	const limit = 256 << 10
	e := newEnv(t, created, func(c *setup) {
		c.MaxBufferedBytes = limit
		c.Routes[0].MaxRequestBody = 4 << 20
	})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	refused := 0
	for i := range 12 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.front.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		conn.Write([]byte("POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: alice\r\nIdempotency-Key: slow-" + string(rune('a'+i)) +
			"\r\nContent-Length: 1048576\r\n\r\n0123456789"))
		if got := e.h.BufferedBytes(); got > limit {
			t.Fatalf("after %d slow clients the buffers hold %d bytes, over the %d budget", i+1, got, limit)
		}
	}
	for _, conn := range conns {
		conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		b := make([]byte, 512)
		if n, _ := conn.Read(b); strings.Contains(string(b[:n]), "buffers-full") {
			refused++
		}
	}
	if refused == 0 {
		t.Error("12 clients declaring 1 MiB each within a 256 KiB budget: none was refused")
	}
	poll.Until(t, "the stalled bodies time out and their buffers are given back", func() bool { return e.h.BufferedBytes() == 0 })
	if n := e.ledger.Total(); n != 0 {
		t.Errorf("%d slow requests reached the upstream", n)
	}
}

// Issue 13, fill: with quota.new_keys, one principal cannot turn Redis into
// its own storage: past N new keys in a window it gets 429 too-many-keys,
// while its retries and replays, and other principals, go on.
func TestNewKeyQuota(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].QuotaNewKeys = 3
		c.Routes[0].QuotaWindow = time.Hour
	})
	for i := 1; i <= 3; i++ {
		if r := e.do(req{user: "alice", key: fmt.Sprint("k", i), body: `{}`}); r.status != http.StatusCreated {
			t.Fatalf("new key %d: %d", i, r.status)
		}
	}
	r := e.do(req{user: "alice", key: "k4", body: `{}`})
	if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "too-many-keys") || r.header.Get("Retry-After") == "" {
		t.Fatalf("fourth new key: %d %q %s, want 429 too-many-keys with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
	}
	for range 3 {
		if r := e.do(req{user: "alice", key: "k1", body: `{}`}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("a retry of an existing key over the quota: %d, want its replay", r.status)
		}
	}
	if r := e.do(req{user: "bob", key: "k1", body: `{}`}); r.status != http.StatusCreated {
		t.Fatalf("another principal: %d, want 201", r.status)
	}
	if n := e.ledger.Total(); n != 4 {
		t.Fatalf("upstream executed %d times, want 4 (three for alice, one for bob)", n)
	}
	noKey, _, _ := e.store.Get(context.Background(), e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k4"))
	if noKey != nil {
		t.Fatal("the refused key left a claim behind")
	}
}

// One principal cannot take the whole buffer budget from the others: past
// its share it gets 429 too-many-bytes while another principal still gets
// in.
func TestPrincipalShareOfTheBufferBudget(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.MaxBufferedBytes = 512 << 10
		c.PrincipalShare = 128 << 10
		c.Routes[0].MaxRequestBody = 4 << 20
	})
	slow := func(user, key string) net.Conn {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.front.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte("POST /payments HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: " + user + "\r\nIdempotency-Key: " + key +
			"\r\nContent-Length: 1048576\r\n\r\n0123456789"))
		return conn
	}
	answer := func(conn net.Conn) string {
		conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		b := make([]byte, 512)
		n, _ := conn.Read(b)
		return string(b[:n])
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 2 { // 2 x 64 KiB: alice's whole share
		conns = append(conns, slow("alice", fmt.Sprint("a", i)))
	}
	poll.Until(t, "alice's two bodies are held", func() bool { return e.h.BufferedBytes() == 128<<10 })
	third := slow("alice", "a2")
	conns = append(conns, third)
	if got := answer(third); !strings.Contains(got, "429") || !strings.Contains(got, "too-many-bytes") {
		t.Fatalf("alice's third slow body: %q, want 429 too-many-bytes", got)
	}
	bob := slow("bob", "b0")
	conns = append(conns, bob)
	poll.Until(t, "bob's body is held too", func() bool { return e.h.BufferedBytes() == 192<<10 })
}

// With identity.source xfcc the principal is the peer's SPIFFE URI from
// X-Forwarded-Client-Cert: a rotated certificate (new Hash) keeps the
// principal's keys; another workload is another principal; from an
// untrusted peer the header is stripped.
func TestXFCCIdentity(t *testing.T) {
	e := newEnv(t, created, func(c *setup) { c.Identity.Source = proxy.SourceXFCC })
	cert := func(hash, uri string) map[string]string {
		return map[string]string{"X-Forwarded-Client-Cert": `By=spiffe://cluster.local/ns/payments/sa/payments;Hash=` + hash + `;Subject="CN=x, O=y";URI=` + uri}
	}
	const checkout = "spiffe://cluster.local/ns/shop/sa/checkout"
	first := e.do(req{key: "k", body: `{}`, header: cert("aaaa", checkout)})
	if first.status != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", first.status, first.body)
	}
	rotated := e.do(req{key: "k", body: `{}`, header: cert("bbbb", checkout)})
	if rotated.status != http.StatusCreated || rotated.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after a certificate rotation: %d, want the replay", rotated.status)
	}
	other := e.do(req{key: "k", body: `{}`, header: cert("aaaa", "spiffe://cluster.local/ns/shop/sa/other")})
	if other.status != http.StatusCreated || other.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("another workload: %d, want its own execution", other.status)
	}
	if r := e.do(req{key: "k2", body: `{}`, header: map[string]string{"X-Forwarded-Client-Cert": `URI="spiffe://unterminated`}}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "identity-invalid") {
		t.Fatalf("malformed XFCC: %d %s, want 400 identity-invalid", r.status, r.body)
	}
	u := newEnv(t, created, func(c *setup) { c.Identity.Source = proxy.SourceXFCC; untrusted(c) })
	if r := u.do(req{key: "k", body: `{}`, header: cert("aaaa", checkout)}); r.status != http.StatusUnauthorized {
		t.Fatalf("XFCC from an untrusted peer: %d, want 401 (stripped, no principal)", r.status)
	}
	// The identity header is stripped from untrusted peers in xfcc mode
	// too: the upstream may read it (it reached the upstream before).
	if r := u.do(req{method: http.MethodGet, path: "/catalog", user: "victim"}); r.status >= 300 || u.ledger.Last().Get("X-Forwarded-User") != "" {
		t.Fatalf("X-Forwarded-User from an untrusted peer in xfcc mode: %d, reached the upstream as %q", r.status, u.ledger.Last().Get("X-Forwarded-User"))
	}
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2", n)
	}
}

// TestIdentityHeaderIsThePrincipalUsed (issue 31): in xfcc and jwt modes
// the principal comes from the certificate or the token; the identity
// header a trusted peer relays (in a mesh: the local Envoy, passing on the
// client's) is not it. The upstream must never read another principal next
// to a key scoped to this one: a protected request carries the principal
// idemproxy used in the identity header (under one spelling), and an
// unprotected one carries none. Before, the header reached the upstream
// as sent: the key was scoped to checkout, the upstream read "bob".
func TestIdentityHeaderIsThePrincipalUsed(t *testing.T) {
	e := newEnv(t, created, func(c *setup) { c.Identity.Source = proxy.SourceXFCC })
	const checkout = "spiffe://cluster.local/ns/shop/sa/checkout"
	xfcc := `Hash=aaaa;URI=` + checkout
	r := e.do(req{key: "k", body: `{}`, user: "bob", header: map[string]string{"X-Forwarded-Client-Cert": xfcc, "X-Forwarded_User": "carol"}})
	if r.status != http.StatusCreated {
		t.Fatalf("protected request: %d %s", r.status, r.body)
	}
	seen := e.ledger.Last()
	if got := seen.Values("X-Forwarded-User"); len(got) != 1 || got[0] != checkout {
		t.Errorf("the upstream read X-Forwarded-User %q, want only the principal idemproxy used, %s", got, checkout)
	}
	if got := seen.Get("X-Forwarded_User"); got != "" {
		t.Errorf("another spelling of the identity header reached the upstream: %q", got)
	}
	if r := e.do(req{method: http.MethodGet, path: "/catalog", user: "bob"}); r.status >= 300 || e.ledger.Last().Get("X-Forwarded-User") != "" {
		t.Errorf("an unprotected request in xfcc mode: %d, the upstream read X-Forwarded-User %q, want none", r.status, e.ledger.Last().Get("X-Forwarded-User"))
	}
}
