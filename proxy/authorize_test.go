package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// Finding 9: with replay.authorize_url, a principal whose access was
// revoked no longer gets the stored response (nor a 409/422 saying the key
// exists); an unreachable authorizer refuses rather than replays.
func TestReplayIsReauthorized(t *testing.T) {
	var mu sync.Mutex
	var asked []http.Header
	authz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Header.Clone())
		mu.Unlock()
		switch r.Header.Get("Authorization") {
		case "Bearer good":
			w.WriteHeader(http.StatusNoContent)
		case "Bearer revoked":
			w.WriteHeader(http.StatusForbidden)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer authz.Close()
	u, _ := url.Parse(authz.URL + "/auth")
	e := newEnv(t, created, func(c *setup) { c.Routes[0].AuthorizeURL = u })
	as := func(token, key, body string) resp {
		return e.do(req{user: "alice", key: key, body: body, header: map[string]string{"Authorization": "Bearer " + token}})
	}
	first := as("good", "k", `{"amount":1}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first attempt: %d", first.status)
	}
	mu.Lock()
	if len(asked) != 0 {
		t.Errorf("the first execution asked the authorizer %d times; it reveals nothing stored", len(asked))
	}
	mu.Unlock()
	for _, tc := range []struct {
		token, body string
		status      int
		typ         string
	}{
		{"revoked", `{"amount":1}`, http.StatusForbidden, "replay-forbidden"},
		{"revoked", `{"amount":2}`, http.StatusForbidden, "replay-forbidden"}, // not a 422 saying the key exists
		{"broken", `{"amount":1}`, http.StatusServiceUnavailable, "authorizer-unavailable"},
	} {
		r := as(tc.token, "k", tc.body)
		if r.status != tc.status || !strings.Contains(r.body, tc.typ) || strings.Contains(r.body, "charged_to") {
			t.Errorf("%s: %d %s, want %d %s without the stored body", tc.token, r.status, r.body, tc.status, tc.typ)
		}
	}
	if r := as("good", "k", `{"amount":1}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || r.body != first.body {
		t.Errorf("still authorized: %d %s, want the replay", r.status, r.body)
	}
	mu.Lock()
	last := asked[len(asked)-1]
	if last.Get("X-Forwarded-User") != "alice" || last.Get("X-Original-Method") != "POST" || last.Get("X-Original-Uri") != "/payments" {
		t.Errorf("the authorizer was asked with %v", last)
	}
	mu.Unlock()
	authz.Close()
	if r := as("good", "k", `{"amount":1}`); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "authorizer-unavailable") {
		t.Errorf("authorizer down: %d %s, want 503 authorizer-unavailable", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Errorf("upstream executed %d times, want 1", n)
	}
}
