package config

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// Protocol values (routes[].protocol).
const (
	ProtocolHTTP    = "http"
	ProtocolGRPC    = "grpc"
	ProtocolConnect = "connect"
)

// GRPC holds a grpc route's own keys.
type GRPC struct {
	// KeyField, when positive, is the number of the request message's
	// top-level string field (AIP-155's request_id) that keys a call
	// without the key metadata; read from the wire, no descriptors.
	KeyField int `yaml:"key_field"`
	// ReleaseCodes are the answered gRPC statuses that free the key, by
	// their canonical names (UNAVAILABLE).
	ReleaseCodes []string `yaml:"release_codes"`
}

// GRPCCodes are gRPC's status codes by their canonical names.
var GRPCCodes = map[string]int{
	"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
	"NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
	"FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
	"INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}

// defaultReleaseCodes are grpc.release_codes' default: the statuses a
// server answers without having acted.
func defaultReleaseCodes() []string { return []string{"UNAVAILABLE", "RESOURCE_EXHAUSTED"} }

// validateProtocol checks routes[].protocol and the keys that belong to
// one protocol.
func (r *Route) validateProtocol(path string, add problemf) {
	if r.Protocol != "" {
		oneOf(path+".protocol", r.Protocol, add, ProtocolHTTP, ProtocolGRPC, ProtocolConnect)
	}
	if r.Protocol != ProtocolGRPC {
		if r.set != nil && (r.set["grpc.key_field"] || r.set["grpc.release_codes"]) {
			add(path+".grpc", "applies to protocol: grpc routes only")
		}
		return
	}
	if r.GRPC.KeyField < 0 || r.GRPC.KeyField > 1<<29-1 {
		add(path+".grpc.key_field", "must be a protobuf field number (1 to 536870911), or 0 for none, got %d", r.GRPC.KeyField)
	}
	for i, c := range r.GRPC.ReleaseCodes {
		if n, ok := GRPCCodes[c]; !ok || n == 0 {
			add(fmt.Sprintf("%s.grpc.release_codes[%d]", path, i), "must be a gRPC status name other than OK (UNAVAILABLE, RESOURCE_EXHAUSTED, ...), got %q", c)
		}
	}
	if r.Reconcile.URL != "" {
		add(path+".reconcile.url", "is not offered on protocol: grpc routes yet: an unknown outcome there follows unknown_outcome")
	}
	if r.Webhook.Provider != "" {
		add(path+".webhook", "a webhook route speaks HTTP: not with protocol: grpc")
	}
	if r.Settings.KeyJSONPointer != "" {
		add(path+".key_json_pointer", "reads a JSON body: on a protocol: grpc route set grpc.key_field")
	}
}

// Stream values (routes[].stream).
const (
	StreamAuto = "auto"
	StreamOff  = "off"
)

// Route is one protected endpoint.
type Route struct {
	// Name labels metrics and logs, and scopes keys.
	Name string `yaml:"name"`
	// Match is a Go http.ServeMux pattern with a method, e.g.
	// "POST /orders/{id}/capture".
	Match string `yaml:"match"`
	// Settings are the route's own, each defaulting to defaults:'s.
	Settings Settings `yaml:",inline"`
	// Webhook, when its provider is set, makes the route a webhook
	// receiver: deliveries are verified by the provider's signature, the
	// principal is the provider and the key its delivery id.
	Webhook Webhook `yaml:"webhook"`
	// Reconcile, when its url is set, asks the upstream what happened
	// where the outcome would be unknown.
	Reconcile Reconcile `yaml:"reconcile"`
	// Stream says what becomes of an answer that streams (text/event-stream
	// or application/x-ndjson without Content-Length): StreamAuto relays
	// it as it arrives, stored chunk by chunk (under store.record_format
	// 4), StreamOff buffers it whole. Empty is StreamAuto.
	Stream string `yaml:"stream"`
	// Protocol is how the route's calls and idemproxy's own answers are
	// framed: ProtocolHTTP (empty too), ProtocolGRPC (unary gRPC calls,
	// over HTTP/2 without TLS on listen and to the upstream) or
	// ProtocolConnect (Connect's unary calls, answers as Connect errors).
	Protocol string `yaml:"protocol"`
	// GRPC is a grpc route's own: where else its key may be, and which
	// answered statuses free it.
	GRPC GRPC `yaml:"grpc"`

	// set holds the setting keys the route's YAML gave, so a bad value it
	// inherited is reported once, at defaults:, not again for every route.
	// Nil (a Route built in code) validates every setting.
	set map[string]bool
}

func (c *Config) validateRoutes(add problemf) {
	names := map[string]int{}
	mux := http.NewServeMux()
	for i, r := range c.Routes {
		path := fmt.Sprintf("routes[%d]", i)
		switch prev, dup := names[r.Name]; {
		case r.Name == "":
			add(path+".name", "must not be empty")
		case dup:
			add(path+".name", "duplicate route name %q (also routes[%d])", r.Name, prev)
		default:
			names[r.Name] = i
		}
		if err := checkPattern(mux, CanonicalPattern(r.Match)); err != nil {
			add(path+".match", "%v", err)
		}
		r.Webhook.validate(path+".webhook.", add)
		r.Reconcile.validate(path+".reconcile.", r, c.Upstream, add)
		if r.Stream != "" {
			oneOf(path+".stream", r.Stream, add, StreamAuto, StreamOff)
		}
		r.validateProtocol(path, add)
		r.Settings.validate(path+".", func(p, format string, args ...any) {
			k := settingKey(strings.TrimPrefix(p, path+"."))
			if r.set == nil || r.set[k] || k == "retention" && r.set["lease"] {
				add(p, format, args...)
			}
		})
	}
}

// settingKey maps a problem's path within a route to the key that causes
// it: "release_on[1]" to "release_on". A retention shorter than the lease
// is the route's doing if it set either.
func settingKey(p string) string {
	if i := strings.IndexByte(p, '['); i >= 0 {
		p = p[:i]
	}
	return p
}

// checkPattern registers pattern on mux, which both parses it and detects
// conflicts with the routes before it. net/http offers pattern parsing only
// through Handle, which panics on a bad pattern; the panic is translated to
// an error here, at the boundary, and nowhere else.
func checkPattern(mux *http.ServeMux, pattern string) (err error) {
	method, path, ok := strings.Cut(strings.TrimSpace(pattern), " ")
	if !ok || method == "" || !strings.HasPrefix(strings.TrimSpace(path), "/") {
		return fmt.Errorf("must be a method and a path, like \"POST /payments\", got %q", pattern)
	}
	if !validToken(method) {
		return fmt.Errorf("%q is not an HTTP method", method)
	}
	path = strings.TrimSpace(path)
	// Each of these would leave a route that never protects what it names,
	// or protects far more, with nothing to say so at run time.
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		return fmt.Errorf("%q contains %q: a route matches the path only, never the query or fragment", pattern, path[i:i+1])
	}
	if path == "/" {
		return fmt.Errorf("%q matches every path; use \"/{$}\" for the root only, or \"/{path...}\" to protect everything", pattern)
	}
	if strings.HasSuffix(path, "/") {
		return fmt.Errorf("%q ends in /, which matches a whole subtree; name the exact path (or end it with {$})", pattern)
	}
	defer func() {
		if r := recover(); r != nil {
			msg := registeredAt.ReplaceAllString(fmt.Sprint(r), "")
			err = errors.New(strings.ReplaceAll(msg, ":\n", ": "))
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return nil
}

// registeredAt is the source position net/http adds to conflict messages;
// it names this file, which helps nobody reading a config error.
var registeredAt = regexp.MustCompile(`\s*\(registered at [^)]*\)`)

// CanonicalPattern is a route's match pattern as it is registered: the
// method upper-cased and single spaces. Request methods are matched
// case-insensitively, so "post /payments" must protect POST /payments,
// and must conflict with "POST /payments".
func CanonicalPattern(match string) string {
	method, path, ok := strings.Cut(strings.TrimSpace(match), " ")
	if !ok {
		return match
	}
	return strings.ToUpper(method) + " " + strings.TrimSpace(path)
}
