package proxy_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

const stripeShape = `{"error":{"type":{{json .Code}},"message":{{json .Detail}},"status":{{.Status}},"request_id":{{json .RequestID}}}}`

// problem_body (issue 20): idemproxy's own answers in the upstream's
// shape, so clients that raise only on an "error" member (stripe-node)
// raise; status and headers unchanged; the stored outcome-unknown too.
func TestProblemBody(t *testing.T) {
	f, err := problemfmt.Parse(stripeShape, "")
	if err != nil {
		t.Fatal(err)
	}
	held := newHeld()
	e := newEnv(t, held.app(created), func(c *setup) {
		c.Routes[0].Problems = f
		c.Problems = f
	})
	var once sync.Once
	release := func() { once.Do(func() { close(held.release) }) }
	defer release() // a failure must not leave the upstream blocked
	check := func(r resp, status int, code string) {
		t.Helper()
		var body struct {
			Error struct {
				Type, Message string
				Status        int
			}
		}
		if r.status != status || r.header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(r.body), &body) != nil || body.Error.Type != code || body.Error.Status != status {
			t.Errorf("%d %s %s, want %d with an error member of type %s", r.status, r.header.Get("Content-Type"), r.body, status, code)
		}
	}
	check(e.do(req{user: "alice", body: `{}`}), http.StatusBadRequest, "key-missing")
	check(e.do(req{user: "alice", key: "bad key", body: `{}`}), http.StatusBadRequest, "key-malformed")
	check(e.do(req{key: "k", body: `{}`}), http.StatusUnauthorized, "identity-missing")
	// A request in progress, then the same key with another body.
	first := make(chan resp, 1)
	go func() { first <- e.do(req{user: "alice", key: "k", body: `{"amount":1}`}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	r := e.do(req{user: "alice", key: "k", body: `{"amount":1}`})
	check(r, http.StatusConflict, "request-in-progress")
	if r.header.Get("Retry-After") == "" {
		t.Error("409 lost its Retry-After with a problem_body")
	}
	release()
	<-first
	check(e.do(req{user: "alice", key: "k", body: `{"amount":2}`}), http.StatusUnprocessableEntity, "key-reused")
	// Outside any route: a refused upgrade.
	hr, _ := http.NewRequest(http.MethodGet, e.front.URL+"/socket", nil)
	hr.Header.Set("Connection", "Upgrade")
	hr.Header.Set("Upgrade", "h2c")
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("a refused upgrade outside any route: %d %s, want 400 in the top-level problem_body", res.StatusCode, res.Header.Get("Content-Type"))
	}
}

// in_progress_status: 503 (issue 20): a retry while the first attempt
// runs gets 503 with Retry-After, which generic retrying clients retry;
// nothing is released or executed again.
func TestInProgressStatus(t *testing.T) {
	held := newHeld()
	e := newEnv(t, held.app(created), func(c *setup) { c.Routes[0].InProgressStatus = http.StatusServiceUnavailable })
	first := make(chan resp, 1)
	go func() { first <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt is upstream", func() bool { return e.ledger.Total() == 1 })
	for range 3 {
		r := e.do(req{user: "alice", key: "k", body: `{}`})
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "request-in-progress") {
			t.Fatalf("retry in progress: %d %q %s, want 503 request-in-progress with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
		}
	}
	close(held.release)
	if r := <-first; r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after: %d, want the replay", r.status)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
}

// key_json_pointer (issue 20): the key from the body when the header is
// absent; a string or an integer; header and body disagreeing is 400; a
// body without it is a missing key.
func TestKeyFromBody(t *testing.T) {
	e := newEnv(t, created, func(c *setup) { c.Routes[0].KeyJSONPointer = "/request_id" })
	body := `{"request_id":"req_81","amount":5}`
	if r := e.do(req{user: "alice", body: body}); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if got := e.ledger.Last().Get("Idempotency-Key"); got != "req_81" {
		t.Errorf("the upstream got key %q, want req_81 in the header", got)
	}
	if r := e.do(req{user: "alice", body: body}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the same body again: %d, want the replay", r.status)
	}
	if r := e.do(req{user: "alice", key: "req_81", body: body}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("header and body agreeing: %d, want the replay", r.status)
	}
	if r := e.do(req{user: "alice", key: "other", body: body}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "key-malformed") {
		t.Fatalf("header and body disagreeing: %d %s, want 400", r.status, r.body)
	}
	integer := `{"request_id":4242,"amount":5}`
	if r := e.do(req{user: "alice", body: integer}); r.status != http.StatusCreated {
		t.Fatalf("an integer id: %d %s", r.status, r.body)
	}
	if r := e.do(req{user: "alice", key: "4242", body: integer}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("an integer id is its decimal form: %d, want the replay", r.status)
	}
	for name, b := range map[string]string{"no member": `{"amount":5}`, "not JSON": `amount=5`} {
		if r := e.do(req{user: "alice", body: b}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "key-missing") {
			t.Errorf("%s: %d %s, want 400 key-missing", name, r.status, r.body)
		}
	}
	if r := e.do(req{user: "alice", body: `{"request_id":1.5}`}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "key-malformed") {
		t.Errorf("a fractional id: %d %s, want 400 key-malformed", r.status, r.body)
	}
	// The key is read as strictly as the body is fingerprinted (issue 31):
	// a duplicated member (parsers disagree on which value wins) or data
	// after the document is 400, not the last value or the first document.
	// Before, both were read loosely and forwarded under req_81 and req_99.
	for name, b := range map[string]string{
		"a duplicated member":    `{"request_id":"req_99","request_id":"req_81","amount":5}`,
		"a duplicated elsewhere": `{"request_id":"req_99","meta":{"a":1,"a":2}}`,
		"trailing data":          `{"request_id":"req_99"}{"request_id":"req_81"}`,
	} {
		if r := e.do(req{user: "alice", body: b}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "key-malformed") {
			t.Errorf("%s: %d %s, want 400 key-malformed", name, r.status, r.body)
		}
	}
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2", n)
	}
}
