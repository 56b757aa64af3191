package proxy

import (
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/idemproxy/idemproxy/config"
)

// route is one protected endpoint, compiled from its config.
type route struct {
	name string
	// scope is hashed into the Redis key: the route's name, or one shared
	// value for scope: principal.
	scope     string
	settings  config.Settings
	fp        *fingerprinter
	releaseOn [600]bool
}

// routeHandler marks a route in the mux. It is never served: the mux is
// used only to match, so its redirects and 405s never answer a client.
type routeHandler struct{ *route }

func (routeHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// router matches requests to routes with Go's ServeMux pattern syntax,
// on a cleaned path, so that //payments, /payments/ and /pay%6Dents are the
// route /payments just as the upstream would most likely see them.
type router struct {
	mux *http.ServeMux
	// names are the route names, in config order.
	names []string
	// methods are the routes' methods: a request with any other method
	// (most pass-through traffic) is not matched against the mux at all.
	methods map[string]bool
}

func newRouter(routes []config.Route) (*router, error) {
	rt := &router{mux: http.NewServeMux(), methods: make(map[string]bool)}
	for i, rc := range routes {
		rt.names = append(rt.names, rc.Name)
		r := &route{name: rc.Name, scope: "route\x00" + rc.Name, settings: rc.Settings}
		if rc.Settings.Scope == config.ScopePrincipal {
			r.scope = "principal"
		}
		fp, err := newFingerprinter(rc.Settings.Fingerprint)
		if err != nil {
			return nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		r.fp = fp
		for _, code := range rc.Settings.ReleaseOn {
			if code >= 0 && code < len(r.releaseOn) {
				r.releaseOn[code] = true
			}
		}
		// config.Validate has rejected every pattern the mux panics on.
		pattern := config.CanonicalPattern(rc.Match)
		rt.mux.Handle(pattern, routeHandler{r})
		method, _, _ := strings.Cut(pattern, " ")
		rt.methods[method] = true
		if method == http.MethodGet {
			rt.methods[http.MethodHead] = true // the mux matches HEAD to GET
		}
	}
	return rt, nil
}

// match returns the route for r and the cleaned path it matched, or nil.
func (rt *router) match(r *http.Request) (*route, string) {
	// Methods are matched case-insensitively: protecting "post" as POST is
	// the safe side if the upstream's framework does the same.
	method := strings.ToUpper(r.Method)
	if !rt.methods[method] {
		return nil, ""
	}
	clean := cleanPath(r.URL.Path)
	u := *r.URL
	u.Path, u.RawPath = clean, ""
	probe := &http.Request{Method: method, Host: r.Host, URL: &u, Header: r.Header}
	h, _ := rt.mux.Handler(probe)
	if rh, ok := h.(routeHandler); ok {
		return rh.route, clean
	}
	return nil, ""
}

// cleanPath collapses repeated slashes and dot segments and drops a
// trailing slash. The path is already percent-decoded by net/http.
func cleanPath(p string) string {
	if strings.HasPrefix(p, "/") {
		return path.Clean(p) // no allocation when p is already clean
	}
	return path.Clean("/" + p)
}
