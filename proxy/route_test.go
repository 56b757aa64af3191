package proxy

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestRouteMethods: a pattern's method matches case-insensitively on both
// sides (a config's "post /payments" protects POST /payments; it once
// silently protected nothing), a GET route also covers HEAD as the mux
// does, and methods no route uses are never matched.
func TestRouteMethods(t *testing.T) {
	rt, err := newRouter([]Route{
		testRoute("pay", config.CanonicalPattern("post /payments")),
		testRoute("report", config.CanonicalPattern("GET  /reports/{id}")),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, path, want string
	}{
		{"POST", "/payments", "pay"},
		{"post", "/payments", "pay"},
		{"PUT", "/payments", ""},
		{"GET", "/payments", ""},
		{"GET", "/reports/7", "report"},
		{"HEAD", "/reports/7", "report"},
		{"POST", "/reports/7", ""},
		{"DELETE", "/other", ""},
	} {
		r, _ := http.NewRequest(tc.method, tc.path, nil)
		r.Method = tc.method // NewRequest keeps it, but be explicit about case
		got := ""
		if route, _ := rt.match(r); route != nil {
			got = route.name
		}
		if got != tc.want {
			t.Errorf("%s %s matched %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestPrefixFilterNeverHidesAMatch: the literal-prefix filter in front of
// the mux is only a shortcut. Over every path of up to three segments
// from an alphabet built to hit the patterns' edges (wildcards, {$},
// escapes, dot segments, encoded slashes), the router with the filter
// answers exactly what the mux alone answers.
func TestPrefixFilterNeverHidesAMatch(t *testing.T) {
	rt, err := newRouter([]Route{
		testRoute("pay", "POST /payments"),
		testRoute("capture", "POST /orders/{id}/capture"),
		testRoute("root", "PUT /{$}"),
		testRoute("all", "PATCH /{rest...}"),
		testRoute("cafe", "POST /caf%C3%A9/{id}"),
		testRoute("slash", "POST /a%2Fb"),
		testRoute("report", "GET /reports/{id}/{$}"),
	})
	if err != nil {
		t.Fatal(err)
	}
	alphabet := []string{"", "payments", "payment", "paymentsx", "orders", "7", "capture", "café", "caf%C3%A9", "a", "b", "a/b", "a%2Fb", "..", ".", "x y", "{id}", "reports"}
	paths := []string{"/"}
	for _, a := range alphabet {
		paths = append(paths, "/"+a)
		for _, b := range alphabet {
			paths = append(paths, "/"+a+"/"+b)
			for _, c := range alphabet {
				paths = append(paths, "/"+a+"/"+b+"/"+c, "/"+a+"/"+b+"/"+c+"/")
			}
		}
	}
	var matched, filtered int
	for _, method := range []string{"POST", "PUT", "PATCH", "GET", "HEAD", "DELETE"} {
		for _, p := range paths {
			r := &http.Request{Method: method, URL: &url.URL{Path: p}, Header: http.Header{}}
			clean := cleanPath(p)
			var want string
			if _, ok := rt.prefixes[method]; ok {
				if found := rt.lookup(r, method, clean); found != nil {
					want = found.name
					matched++
				}
			}
			got := ""
			if found, _ := rt.match(r); found != nil {
				got = found.name
			}
			if got != want {
				t.Fatalf("%s %s: router matched %q, the mux alone %q", method, p, got, want)
			}
			if !mayMatch(rt.prefixes[method], clean) {
				filtered++
			}
		}
	}
	if matched == 0 || filtered == 0 {
		t.Fatalf("the paths exercised too little: %d matched, %d filtered out", matched, filtered)
	}
	t.Logf("%d requests: %d matched, %d filtered out before the mux", 6*len(paths), matched, filtered)
}
