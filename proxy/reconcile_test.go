package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"testing"
	"time"
)

// TestLookupCountsOnlyAnswersThatEchoTheKey (issue 43): the lookup is a
// GET of the template on the upstream's path, the key and principal
// escaped for where they stand and sent in the key and identity headers;
// an answer counts only when it echoes the key, redirects are not
// followed, and a found answer is what gets stored.
func TestLookupCountsOnlyAnswersThatEchoTheKey(t *testing.T) {
	type seen struct{ path, rawPath, query, user, key string }
	got := make(chan seen, 16)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Header.Get("X-Forwarded-User"), r.Header.Get("Idempotency-Key")}
		key := r.Header.Get("Idempotency-Key")
		switch {
		case strings.HasPrefix(key, "found"):
			w.Header().Set("Idempotency-Key", key)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Set-Cookie", "s=1")
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"id":"ch_1"}`))
		case strings.HasPrefix(key, "absent"):
			w.Header().Set("Idempotency-Key", key)
			w.WriteHeader(http.StatusNotFound)
		case strings.HasPrefix(key, "router"):
			w.WriteHeader(http.StatusNotFound) // a 404 that never reached the app: no echo
		case strings.HasPrefix(key, "moved"):
			w.Header().Set("Idempotency-Key", key)
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case strings.HasPrefix(key, "slow"):
			time.Sleep(300 * time.Millisecond)
			w.Header().Set("Idempotency-Key", key)
			w.WriteHeader(http.StatusNotFound)
		default:
			w.Header().Set("Idempotency-Key", key)
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL + "/api/")
	rc := &Reconcile{URL: "/payments/by-key/{key}?who={principal}&r={route}", Found: []int{200}, Absent: []int{404}, Status: http.StatusCreated, Timeout: 100 * time.Millisecond, AbsentAfter: time.Minute}
	h, err := New(Config{Upstream: u, Identity: Identity{Header: "X-Forwarded-User"}, Routes: []Route{{Name: "pay", Pattern: "POST /payments", KeyHeader: "Idempotency-Key", Reconcile: rc, Unknown: Fail, ExcludeHeaders: []string{"Set-Cookie"}}}}, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/payments", nil)
	rt, _ := h.routes.Load().match(req)
	if rt == nil {
		t.Fatal("the route did not match")
	}
	ask := func(principal, key string) lookupAnswer {
		return h.lookup(context.Background(), rt, principal, key, 1<<20)
	}

	a := ask("alice & bob", "found/1 ?x")
	var s seen
	select {
	case s = <-got:
	case <-time.After(5 * time.Second):
		t.Fatalf("the lookup never reached the upstream: %+v", a)
	}
	if s.rawPath != "/api/payments/by-key/found%2F1%20%3Fx" || s.path != "/api/payments/by-key/found/1 ?x" {
		t.Errorf("lookup path %q (raw %q), want the key escaped inside its segment under the upstream's path", s.path, s.rawPath)
	}
	if q, _ := url.ParseQuery(s.query); q.Get("who") != "alice & bob" || q.Get("r") != "pay" {
		t.Errorf("lookup query %q, want who=alice & bob and r=pay", s.query)
	}
	if s.user != "alice & bob" || s.key != "found/1 ?x" {
		t.Errorf("lookup headers: user %q key %q", s.user, s.key)
	}
	if a.result != lookupFound || a.status != http.StatusCreated || string(a.body) != `{"id":"ch_1"}` || a.header.Get("Content-Type") != "application/json" {
		t.Errorf("found: %+v", a)
	}
	if a.header.Get("Set-Cookie") != "" || a.header.Get("Connection") != "" {
		t.Errorf("found answer keeps %v: excluded and hop-by-hop headers are never stored", a.header)
	}
	for _, tc := range []struct{ key, want string }{
		{"absent-1", lookupAbsent},
		{"router-1", lookupUnresolved},
		{"moved-1", lookupUnresolved},
		{"slow-1", lookupUnresolved},
		{"broken-1", lookupUnresolved},
	} {
		if a := ask("alice", tc.key); a.result != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.key, a.result, a.why, tc.want)
		}
		<-got
	}
	select {
	case s := <-got:
		t.Errorf("a redirect was followed to %s", s.path)
	default:
	}
	if a := h.lookup(context.Background(), rt, "alice", "found-big", 4); a.result != lookupUnresolved {
		t.Errorf("a found answer larger than the bound: %s, want unresolved", a.result)
	}
}

// TestLookupEscapesDotSegments (issue 53): a key or principal made only
// of dots is escaped (%2E) in the lookup's path, so no router that
// removes dot segments turns /by-key/.. into another path; 0fc8fae sent
// /payments/by-key/.. as it was.
func TestLookupEscapesDotSegments(t *testing.T) {
	up, _ := url.Parse("http://app:8080/api")
	rc := &Reconcile{URL: "/payments/{principal}/by-key/{key}?k={key}"}
	for _, tc := range []struct{ principal, key, raw string }{
		{"alice", "..", "/api/payments/alice/by-key/%2E%2E"},
		{"alice", ".", "/api/payments/alice/by-key/%2E"},
		{"..", "...", "/api/payments/%2E%2E/by-key/%2E%2E%2E"},
		{"alice", "..a", "/api/payments/alice/by-key/..a"},
		{"alice", "a/..", "/api/payments/alice/by-key/a%2F.."},
	} {
		u := lookupURL(up, rc, tc.key, tc.principal, "pay")
		if got := u.EscapedPath(); got != tc.raw {
			t.Errorf("principal %q key %q: path %s, want %s", tc.principal, tc.key, got, tc.raw)
		}
		if want := "k=" + url.QueryEscape(tc.key); u.RawQuery != want {
			t.Errorf("key %q: query %s, want %s", tc.key, u.RawQuery, want)
		}
		if cleaned := path.Clean(u.EscapedPath()); cleaned != u.EscapedPath() {
			t.Errorf("key %q: a router's dot-segment removal turns %s into %s", tc.key, u.EscapedPath(), cleaned)
		}
	}
}

func TestReconcileTemplates(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"/payments/by-key/{key}", true},
		{"/payments?key={key}&p={principal}&r={route}", true},
		{"/payments/by-key", false},
		{"http://other/{key}", false},
		{"/p/{key}#frag", false},
		{"/p/{key}/{id}", false},
	} {
		err := checkReconcile(&Reconcile{URL: tc.url, Found: []int{200}, Absent: []int{404}})
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", tc.url, err, tc.ok)
		}
	}
	if err := checkReconcile(&Reconcile{URL: "/p/{key}", Found: []int{200, 404}, Absent: []int{404}}); err == nil {
		t.Error("a status both found and absent was accepted")
	}
	if _, err := New(Config{Routes: []Route{{Name: "w", Pattern: "POST /w", KeyHeader: "Idempotency-Key", Webhook: &Webhook{Provider: "stripe", Secrets: [][]byte{[]byte("whsec_x")}}, Unknown: Fail, Reconcile: &Reconcile{URL: "/p/{key}", Found: []int{200}, Absent: []int{404}}}}}, nil, Options{}); err == nil {
		t.Error("reconcile on a webhook route was accepted")
	}
}

// TestEveryStoreOpIsListedOnce: each store operation is one op label,
// listed once (its span is the store's to name: claim.Span; the Redis
// store's test names every one).
func TestEveryStoreOpIsListedOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, op := range storeOps {
		if op == "" || seen[op] {
			t.Errorf("store op %q: listed before: %v", op, seen[op])
		}
		seen[op] = true
	}
}

// TestFoundStatusDefault (issue 57): without reconcile.status, a POST
// route stores a lookup's 200 as 201, what its clients expect of a create
// that took effect (before, a 201 endpoint's reconciled answer was 200);
// other found statuses, and other methods, keep the lookup's; a set
// reconcile.status wins.
func TestFoundStatusDefault(t *testing.T) {
	for _, tc := range []struct {
		pattern     string
		set, lookup int
		want        int
	}{
		{"POST /payments", 0, 200, 201},
		{"POST /payments", 0, 500, 500},
		{"POST /payments", 0, 202, 202},
		{"PUT /payments/{id}", 0, 200, 200},
		{"POST /payments", 200, 200, 200},
		{"POST /payments", 201, 500, 201},
	} {
		rt := &route{settings: Route{Pattern: tc.pattern, Reconcile: &Reconcile{Status: tc.set}}}
		if got := foundStatus(rt, tc.lookup); got != tc.want {
			t.Errorf("%s, reconcile.status %d, lookup %d: stored %d, want %d", tc.pattern, tc.set, tc.lookup, got, tc.want)
		}
	}
}
