package proxy_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/poll"
)

// IETF draft alignment: problem types can be documentation links, the
// 400/409/422 answers link the documentation of the rules, and a route
// may advertise its retention.
func TestProblemLinksAndRetention(t *testing.T) {
	e := newEnv(t, slow(300*time.Millisecond, created), func(c *setup) {
		c.ProblemTypeBase = "https://docs.example.com/idempotency/problems/"
		c.ProblemDocsURL = "https://docs.example.com/idempotency"
		c.Routes[0].AdvertiseRetention = true
		c.Routes[0].Retention = 2 * time.Hour
	})
	const link = `<https://docs.example.com/idempotency>; rel="describedby"`
	r := e.do(req{user: "alice", body: `{}`})
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"type":"https://docs.example.com/idempotency/problems/key-missing"`) || r.header.Get("Link") != link {
		t.Fatalf("400: %d %v %s", r.status, r.header.Get("Link"), r.body)
	}
	done := make(chan resp, 1)
	go func() { done <- e.do(req{user: "alice", key: "k", body: `{}`}) }()
	poll.Until(t, "the first attempt reaches the upstream", func() bool { return e.ledger.Total() == 1 })
	if r := e.do(req{user: "alice", key: "k", body: `{}`}); r.status != http.StatusConflict || r.header.Get("Link") != link {
		t.Errorf("409: %d %q", r.status, r.header.Get("Link"))
	}
	first := <-done
	if first.status != http.StatusCreated || first.header.Get("Idempotency-Retention") != "7200" || first.header.Get("Link") != "" {
		t.Errorf("first attempt: %d, retention %q, link %q", first.status, first.header.Get("Idempotency-Retention"), first.header.Get("Link"))
	}
	replay := e.do(req{user: "alice", key: "k", body: `{}`})
	if replay.header.Get("Idempotency-Retention") != "7200" || replay.body != first.body {
		t.Errorf("replay: retention %q", replay.header.Get("Idempotency-Retention"))
	}
	if r := e.do(req{user: "alice", key: "k", body: `{"other":1}`}); r.status != http.StatusUnprocessableEntity || r.header.Get("Link") != link {
		t.Errorf("422: %d %q", r.status, r.header.Get("Link"))
	}
}
