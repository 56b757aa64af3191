package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"
)

// route is one protected endpoint, compiled from its config.
type route struct {
	name string
	// scope is hashed into the Redis key: the route's name, or one shared
	// value for scope: principal (never on a webhook route). legacyScope
	// is what v0.5.0 hashed, which scoped webhook routes as configured.
	scope, legacyScope string
	settings           Route
	// keyHeader is settings.KeyHeader in canonical form; keyNames holds
	// it for nominated.
	keyHeader string
	keyNames  nameSet
	fp        *fingerprinter
	releaseOn [600]bool
	// httpRoute is the pattern's path, the http.route of its spans.
	httpRoute string
	// keyPointer, when set, finds the key in a JSON body.
	keyPointer []string
	// grpc marks a protocol: grpc route; grpcRelease its release codes.
	grpc        bool
	grpcRelease [17]bool
	// front frames idemproxy's own answers on the route (its refusals,
	// the outcome-unknown record the protocol stores): the framer of the
	// front that serves it, set before the route serves.
	front framer
}

// KeyScope is what a route hashes into its Redis keys beside the principal
// and the idempotency key: its own name, or, when shared (scope:
// principal), one value that every such route shares.
func KeyScope(route string, shared bool) string {
	if shared {
		return "principal"
	}
	return "route\x00" + route
}

// routeHandler marks a route in the mux. It is never served: the mux is
// used only to match, so its redirects and 405s never answer a client.
type routeHandler struct{ rt *route }

func (routeHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// router matches requests to routes with Go's ServeMux pattern syntax,
// on a cleaned path, so that //payments, /payments/ and /pay%6Dents are the
// route /payments just as the upstream would most likely see them.
type router struct {
	mux *http.ServeMux
	// names are the route names, in config order; scopes their key
	// scopes by name.
	names  []string
	scopes map[string]string
	// retention is each route's, by name (idemproxy_route_retention_seconds).
	retention map[string]time.Duration
	// reconciles holds the routes that reconcile, by name; byName every
	// route.
	reconciles map[string]bool
	byName     map[string]*route
	// prefixes are, per method, the literal starts of the routes' paths
	// (up to their first wildcard): a request whose method no route uses,
	// or whose path starts with none of its method's prefixes (most
	// pass-through traffic), is not matched against the mux at all. A
	// miss in the mux costs ten allocations, to work out a 405
	// (BenchmarkRouteMatchOtherPath; docs/benchmarks.md).
	prefixes map[string][]string
}

func newRouter(routes []Route) (*router, error) {
	rt := &router{mux: http.NewServeMux(), prefixes: make(map[string][]string), scopes: make(map[string]string), retention: make(map[string]time.Duration), reconciles: make(map[string]bool), byName: make(map[string]*route)}
	for i, rc := range routes {
		rt.names = append(rt.names, rc.Name)
		r := &route{name: rc.Name, scope: KeyScope(rc.Name, rc.SharedScope && rc.Webhook == nil), legacyScope: KeyScope(rc.Name, rc.SharedScope), settings: rc, keyHeader: http.CanonicalHeaderKey(rc.KeyHeader), keyNames: nameSet{rc.KeyHeader}}
		rt.scopes[rc.Name] = r.scope
		rt.byName[rc.Name] = r
		rt.retention[rc.Name] = rc.Retention
		rt.reconciles[rc.Name] = rc.Reconcile != nil
		fp, err := newFingerprinter(rc.FingerprintHeaders, rc.IgnoreJSONFields)
		if err != nil {
			return nil, fmt.Errorf("routes[%d]: %w", i, err)
		}
		r.fp = fp
		if rc.Webhook != nil {
			if _, ok := providers[rc.Webhook.Provider]; !ok {
				return nil, fmt.Errorf("routes[%d]: unknown webhook provider %q", i, rc.Webhook.Provider)
			}
		}
		if rc.Reconcile != nil {
			if rc.Webhook != nil {
				return nil, fmt.Errorf("routes[%d]: reconcile on a webhook route: a provider is never asked", i)
			}
			if err := checkReconcile(rc.Reconcile); err != nil {
				return nil, fmt.Errorf("routes[%d]: %w", i, err)
			}
		}
		if r.keyPointer, err = keyPointer(rc.KeyJSONPointer); err != nil {
			return nil, fmt.Errorf("routes[%d]: key_json_pointer: %w", i, err)
		}
		r.grpc = rc.Protocol == ProtocolGRPC
		for _, code := range rc.GRPCRelease {
			if code >= 0 && code < len(r.grpcRelease) {
				r.grpcRelease[code] = true
			}
		}
		for _, code := range rc.ReleaseOn {
			if code >= 0 && code < len(r.releaseOn) {
				r.releaseOn[code] = true
			}
		}
		// The caller validated the pattern: the mux panics on a bad one.
		pattern := rc.Pattern
		rt.mux.Handle(pattern, routeHandler{r})
		method, p, _ := strings.Cut(pattern, " ")
		r.httpRoute = p
		prefix := literalPrefix(p)
		rt.prefixes[method] = append(rt.prefixes[method], prefix)
		if method == http.MethodGet { // the mux matches HEAD to GET
			rt.prefixes[http.MethodHead] = append(rt.prefixes[http.MethodHead], prefix)
		}
	}
	return rt, nil
}

// literalPrefix is the part of a pattern's path every matching (cleaned,
// decoded) path starts with: up to its first wildcard. A pattern with an
// escape in it is matched segment by segment after unescaping, so only
// "/" is certain.
func literalPrefix(p string) string {
	if i := strings.IndexByte(p, '{'); i >= 0 {
		p = p[:i]
	}
	if strings.Contains(p, "%") {
		return "/"
	}
	return p
}

// mayMatch reports whether a route with one of prefixes could match path:
// a necessary condition, cheap enough to run on every request.
func mayMatch(prefixes []string, path string) bool {
	for _, prefix := range prefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}
	return false
}

// match returns the route for r and the cleaned path it matched, or nil.
func (rt *router) match(r *http.Request) (*route, string) {
	// Methods are matched case-insensitively: protecting "post" as POST is
	// the safe side if the upstream's framework does the same.
	method := strings.ToUpper(r.Method)
	prefixes, ok := rt.prefixes[method]
	if !ok {
		return nil, "" // before cleaning: cleanPath may allocate
	}
	clean := cleanPath(r.URL.Path)
	if !mayMatch(prefixes, clean) {
		return nil, ""
	}
	if found := rt.lookup(r, method, clean); found != nil {
		return found, clean
	}
	return nil, ""
}

// lookup matches a request to a route in the mux, with method upper-cased
// and path cleaned.
func (rt *router) lookup(r *http.Request, method, clean string) *route {
	u := *r.URL
	u.Path, u.RawPath = clean, ""
	probe := &http.Request{Method: method, Host: r.Host, URL: &u, Header: r.Header}
	h, _ := rt.mux.Handler(probe)
	if rh, ok := h.(routeHandler); ok {
		return rh.rt
	}
	return nil
}

// cleanPath collapses repeated slashes and dot segments and drops a
// trailing slash. The path is already percent-decoded by net/http.
func cleanPath(p string) string {
	if strings.HasPrefix(p, "/") {
		return path.Clean(p) // no allocation when p is already clean
	}
	return path.Clean("/" + p)
}

// Template fields, as written in a reconcile URL.
const (
	fieldKey       = "{key}"
	fieldPrincipal = "{principal}"
	fieldRoute     = "{route}"
)

// checkReconcile reports what makes rc unusable: a template that cannot
// carry the key, or one outside the upstream's path (absolute URL,
// fragment, unknown field).
func checkReconcile(rc *Reconcile) error {
	t := rc.URL
	if !strings.HasPrefix(t, "/") {
		return fmt.Errorf("reconcile url %q: want a path on the upstream, starting with /", t)
	}
	if strings.Contains(t, "#") {
		return fmt.Errorf("reconcile url %q: a fragment is never sent", t)
	}
	if !strings.Contains(t, fieldKey) {
		return fmt.Errorf("reconcile url %q: it must carry {key}, or every key would get the same answer", t)
	}
	rest := t
	for _, f := range []string{fieldKey, fieldPrincipal, fieldRoute} {
		rest = strings.ReplaceAll(rest, f, "")
	}
	if strings.ContainsAny(rest, "{}") {
		return fmt.Errorf("reconcile url %q: only {key}, {principal} and {route} are replaced", t)
	}
	for _, s := range rc.Found {
		if slices.Contains(rc.Absent, s) {
			return fmt.Errorf("reconcile: status %d is both found and absent", s)
		}
	}
	if len(rc.Found) == 0 || len(rc.Absent) == 0 {
		return errors.New("reconcile: found and absent need a status each")
	}
	return nil
}
