package proxy_test

import (
	"net/http"
	"testing"
)

// OASIS Repeatable Requests (issue 46): on a route keyed by
// Repeatability-Request-ID, an executed or replayed answer says
// Repeatability-Result: accepted, one refused for its key says rejected;
// a request without the header, or a route keyed otherwise, gets none.
func TestRepeatabilityResult(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].KeyHeader = "Repeatability-Request-ID"
	})
	send := func(id, body string) resp {
		return e.do(req{user: "alice", body: body, header: map[string]string{"Repeatability-Request-ID": id}})
	}
	first := send("rr-1", `{"amount":1}`)
	if first.status != http.StatusCreated || first.header.Get("Repeatability-Result") != "accepted" {
		t.Fatalf("executed: %d, Repeatability-Result %q; want accepted", first.status, first.header.Get("Repeatability-Result"))
	}
	again := send("rr-1", `{"amount":1}`)
	if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Repeatability-Result") != "accepted" {
		t.Fatalf("replayed: %v; want accepted", again.header)
	}
	for name, r := range map[string]resp{
		"another body (422)":   send("rr-1", `{"amount":2}`),
		"a malformed id (400)": send(`"open`, `{}`),
	} {
		if got := r.header.Get("Repeatability-Result"); got != "rejected" {
			t.Errorf("%s: %d, Repeatability-Result %q; want rejected", name, r.status, got)
		}
	}
	if r := e.do(req{user: "alice", body: `{}`}); r.status != http.StatusBadRequest || r.header.Get("Repeatability-Result") != "" {
		t.Errorf("no Repeatability-Request-ID: %d, Repeatability-Result %q; want 400 and none", r.status, r.header.Get("Repeatability-Result"))
	}
	other := newEnv(t, created, nil)
	r := other.do(req{user: "alice", key: "k", body: `{}`, header: map[string]string{"Repeatability-Request-ID": "rr-2"}})
	if r.header.Get("Repeatability-Result") != "" {
		t.Errorf("a route keyed by Idempotency-Key answered Repeatability-Result %q", r.header.Get("Repeatability-Result"))
	}
}
