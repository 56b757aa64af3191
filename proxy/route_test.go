package proxy

import (
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestRouteMethods: a pattern's method matches case-insensitively on both
// sides (a config's "post /payments" protects POST /payments; it once
// silently protected nothing), a GET route also covers HEAD as the mux
// does, and methods no route uses are never matched.
func TestRouteMethods(t *testing.T) {
	rt, err := newRouter([]config.Route{
		{Name: "pay", Match: "post /payments", Settings: config.DefaultSettings()},
		{Name: "report", Match: "GET  /reports/{id}", Settings: config.DefaultSettings()},
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
