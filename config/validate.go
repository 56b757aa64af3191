package config

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/internal/jsonpointer"
	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

// Validate checks the configuration and reports every problem at once, each
// prefixed with its YAML path.
func (c *Config) Validate() error { return c.validate(nil) }

// validate skips the paths in failed, which already have a decoding
// problem. Each section validates itself; every problem is reported, each
// by its YAML path.
func (c *Config) validate(failed map[string]bool) error {
	var errs []error
	add := func(path, format string, args ...any) {
		if failed[path] {
			return
		}
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{path + fromEnv(path)}, args...)...))
	}
	c.validateListeners(add)
	oneOf("log_level", c.LogLevel, add, "debug", "info", "warn", "error")
	oneOf("tracing.trust_incoming", c.Tracing.TrustIncoming, add, TraceTrustTrustedPeers, TraceTrustAll, TraceTrustNone)
	c.validateUpstream(add)
	c.validateStore(add)
	c.Identity.validate(add)
	c.Defaults.validate("defaults.", add)
	c.validateRoutes(add)
	return errors.Join(errs...)
}

// hostPort checks that addr is host:port with a numeric port, as a
// listener or a Redis address needs: "8080" alone parses as a YAML number
// and fails only when the listener is bound, or never, for Redis.
func hostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port (e.g. :8080, 127.0.0.1:8080, redis:6379), got %q", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("must be host:port with a port from 0 to 65535, got %q", addr)
	}
	return nil
}

// problemf records one problem at a YAML path.
type problemf = func(path, format string, args ...any)

func (c *Config) validateListeners(add problemf) {
	for _, l := range []struct{ key, addr string }{{"listen", c.Listen}, {"admin_listen", c.AdminListen}} {
		if l.addr == "" {
			add(l.key, "must not be empty")
		} else if err := hostPort(l.addr); err != nil {
			add(l.key, "%v", err)
		}
	}
	if c.Listen != "" && c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		add("admin_listen", "must differ from listen: the admin port is never exposed to clients")
	}
	if c.AdminPprofListen != "" {
		if err := loopbackAddr(c.AdminPprofListen); err != nil {
			add("admin_pprof_listen", "%v", err)
		} else if (c.AdminPprofListen == c.Listen || c.AdminPprofListen == c.AdminListen) && !strings.HasSuffix(c.AdminPprofListen, ":0") {
			add("admin_pprof_listen", "must differ from listen and admin_listen: pprof has a listener of its own")
		}
	}
	if c.Client.ReadHeaderTimeout <= 0 {
		add("client.read_header_timeout", "must be positive, got %s", c.Client.ReadHeaderTimeout)
	}
	if c.Client.BodyTimeout <= 0 {
		add("client.body_timeout", "must be positive, got %s", c.Client.BodyTimeout)
	}
	if c.Drain.Delay < 0 {
		add("drain.delay", "must not be negative, got %s", c.Drain.Delay)
	}
	if c.Drain.Timeout < 0 {
		add("drain.timeout", "must not be negative, got %s", c.Drain.Timeout)
	}
	if c.Limits.PrincipalShare < 0 || c.Limits.PrincipalShare > 1 {
		add("limits.principal_share", "must be between 0%% and 100%%, got %g%%", c.Limits.PrincipalShare*100)
	}
	for i, p := range c.PassThroughUpgrades {
		if !validToken(p) {
			add(fmt.Sprintf("pass_through_upgrades[%d]", i), "%q is not a protocol name (an Upgrade header token, e.g. websocket)", p)
		}
	}
	for key, v := range map[string]string{"problems.type_base_url": c.Problems.TypeBaseURL, "problems.docs_url": c.Problems.DocsURL} {
		if u, err := url.Parse(v); v != "" && (err != nil || u.Scheme == "" || (u.Scheme != "urn" && u.Host == "")) {
			add(key, "must be an absolute URL (https://...) or a URN, got %q", v)
		}
	}
}

func (c *Config) validateUpstream(add problemf) {
	if u, ok := httpURL(c.Upstream.URL); !ok {
		add("upstream.url", "must be an absolute http or https URL, got %q", c.Upstream.URL)
	} else if key, own := ownListener(u, c.Listen, c.AdminListen); own != "" {
		add("upstream.url", "%q is idemproxy's own %s (%s): every request would loop back into the proxy; point it at the app", c.Upstream.URL, key, own)
	}
	if c.Upstream.Timeout <= 0 {
		add("upstream.timeout", "must be positive, got %s", c.Upstream.Timeout)
	}
	if c.Upstream.LateAnswerWindow < 0 {
		add("upstream.late_answer_window", "must not be negative (0s cancels the upstream call at upstream.timeout), got %s", c.Upstream.LateAnswerWindow)
	}
	if c.Upstream.LateCallsPrincipalShare < 0 || c.Upstream.LateCallsPrincipalShare > 1 {
		add("upstream.late_calls_principal_share", "must be between 0%% and 100%%, got %g%%", c.Upstream.LateCallsPrincipalShare*100)
	}
	if c.Upstream.MaxLateCalls < 0 {
		add("upstream.max_late_calls", "must not be negative, got %d", c.Upstream.MaxLateCalls)
	}
	if p := c.Upstream.HealthPath; p != "" && (!strings.HasPrefix(p, "/") || strings.ContainsAny(p, "# \t")) {
		add("upstream.health_path", "must be a path on the upstream starting with / (e.g. /healthz), got %q", p)
	}
}

func (c *Config) validateStore(add problemf) {
	st := &c.Store
	if st.RecordFormat < 1 || st.RecordFormat > 3 {
		add("store.record_format", "must be 1, 2 or 3, got %d", st.RecordFormat)
	}
	oneOf("store.compression", st.Compression, add, CompressionNone, CompressionZstd)
	if st.RecordFormat == 2 && st.KeySecretFile == "" {
		add("store.record_format", "2 keys fingerprints with store.key_secret_file (never a sealing key, which rotates), which is not set: set it, or keep 1")
	}
	if st.KeyPrefix == "" {
		add("store.key_prefix", "must not be empty: it keeps idemproxy's keys apart from other data")
	}
	r := st.Redis
	if r.Password != "" && r.PasswordFile != "" {
		add("store.redis.password_file", "set either store.redis.password or store.redis.password_file, not both")
	}
	if r.MasterName == "" {
		for key, v := range map[string]string{"sentinel_username": r.SentinelUsername, "sentinel_password": r.SentinelPassword, "sentinel_password_file": r.SentinelPasswordFile} {
			if v != "" {
				add("store.redis."+key, "is only used with Sentinel: set store.redis.master_name, or remove it")
			}
		}
	} else if r.SentinelPassword != "" && r.SentinelPasswordFile != "" {
		add("store.redis.sentinel_password_file", "set either store.redis.sentinel_password or store.redis.sentinel_password_file, not both")
	}
	for i, a := range r.Addrs {
		if err := hostPort(a); err != nil {
			add(fmt.Sprintf("store.redis.addrs[%d]", i), "%v", err)
		}
	}
	if r.MasterName != "" && len(r.Addrs) == 0 {
		add("store.redis.addrs", "must list the sentinels when store.redis.master_name is set")
	}
	if !r.TLS && (r.TLSCAFile != "" || r.TLSServerName != "") {
		add("store.redis.tls", "must be true when store.redis.tls_ca_file or tls_server_name is set")
	}
	if st.ClaimMemoryLimit < 0 || st.ClaimMemoryLimit > 1 {
		add("store.claim_memory_limit", "must be between 0%% and 100%%, got %g%%", st.ClaimMemoryLimit*100)
	}
	if st.Encryption.Required && len(st.Encryption.KeyFiles) == 0 {
		add("store.encryption.required", "needs store.encryption.key_files")
	}
	for i, f := range st.Encryption.KeyFiles {
		if strings.TrimSpace(f) == "" {
			add(fmt.Sprintf("store.encryption.key_files[%d]", i), "must name a file")
		}
	}
	if st.WaitReplicas < 0 {
		add("store.wait_replicas", "must not be negative, got %d", st.WaitReplicas)
	}
	if st.WaitReplicas > 0 && st.WaitTimeout <= 0 {
		add("store.wait_timeout", "must be positive when store.wait_replicas is set, got %s", st.WaitTimeout)
	}
}

func (id *Identity) validate(add problemf) {
	oneOf("identity.source", id.Source, add, IdentitySources...)
	if j := id.JWT; id.Source == IdentityFromJWT {
		if _, ok := httpURL(j.JWKSURL); !ok {
			add("identity.jwt.jwks_url", "must be an absolute http or https URL with identity.source jwt, got %q", j.JWKSURL)
		}
		if j.Issuer == "" {
			add("identity.jwt.issuer", "must be set with identity.source jwt: tokens of any other issuer are refused")
		}
		if len(j.Audience) == 0 {
			add("identity.jwt.audience", "must list at least one audience with identity.source jwt: a token meant for another service must not be accepted")
		}
		if j.Claim == "" {
			add("identity.jwt.claim", "must name the claim that holds the principal (sub)")
		}
		if j.Leeway < 0 || j.Leeway > 5*time.Minute {
			add("identity.jwt.leeway", "must be between 0s and 5m, got %s", j.Leeway)
		}
	}
	if id.Header == "" {
		add("identity.header", "must not be empty")
	} else if !validToken(id.Header) {
		add("identity.header", "%q is not a valid header name", id.Header)
	}
	for i, h := range id.StripFromUntrusted {
		if !validToken(h) {
			add(fmt.Sprintf("identity.strip_from_untrusted[%d]", i), "%q is not a valid header name", h)
		}
	}
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
		r.Settings.validate(path+".", func(p, format string, args ...any) {
			k := settingKey(strings.TrimPrefix(p, path+"."))
			if r.set == nil || r.set[k] || k == "retention" && r.set["lease"] {
				add(p, format, args...)
			}
		})
	}
}

// httpURL parses an absolute http or https URL; ok is false for anything
// else.
func httpURL(s string) (u *url.URL, ok bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, false
	}
	return u, true
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

func (s *Settings) validate(path string, add func(path, format string, args ...any)) {
	if !validToken(s.KeyHeader) {
		add(path+"key_header", "%q is not a valid header name", s.KeyHeader)
	}
	oneOf(path+"scope", s.Scope, add, ScopeRoute, ScopePrincipal)
	oneOf(path+"concurrent", s.Concurrent, add, ConcurrentReject, ConcurrentWait)
	oneOf(path+"unknown_outcome", s.UnknownOutcome, add, UnknownOutcomes...)
	oneOf(path+"store_unavailable", s.StoreUnavailable, add, FailClosed, FailOpen)
	if s.InProgressStatus != http.StatusConflict && s.InProgressStatus != http.StatusTooManyRequests && s.InProgressStatus != http.StatusServiceUnavailable {
		add(path+"in_progress_status", "must be 409, 429 or 503, got %d", s.InProgressStatus)
	}
	if s.MaxInFlight < 0 {
		add(path+"max_in_flight", "must be 0 (no bound) or positive, got %d", s.MaxInFlight)
	}
	for i, src := range s.FirstSent {
		oneOf(fmt.Sprintf("%sfirst_sent[%d]", path, i), src, add, FirstSentSources...)
	}
	if s.FirstSentSkew < 0 || s.FirstSentSkew > time.Hour {
		add(path+"first_sent_skew", "must be between 0s and 1h, got %s", s.FirstSentSkew)
	}
	if s.MaxInFlightPrincipalShare <= 0 || s.MaxInFlightPrincipalShare > 1 {
		add(path+"max_in_flight_principal_share", "must be more than 0%% and at most 100%%, got %g%%", s.MaxInFlightPrincipalShare*100)
	}
	if s.KeyJSONPointer != "" {
		if _, err := jsonpointer.Parse(s.KeyJSONPointer); err != nil {
			add(path+"key_json_pointer", "%v", err)
		}
	}
	if _, err := problemfmt.Parse(s.ProblemBody, s.ProblemContentType); err != nil {
		add(path+"problem_body", "%v", err)
	}
	if s.ProblemBody == "" && s.ProblemContentType != "" {
		add(path+"problem_content_type", "goes with problem_body, which is empty")
	}
	if s.Lease < MinLease {
		add(path+"lease", "must be at least %s, got %s", MinLease, s.Lease)
	}
	if s.Retention < s.Lease {
		add(path+"retention", "must not be shorter than lease (%s), got %s", s.Lease, s.Retention)
	}
	if s.MaxWait < 0 {
		add(path+"max_wait", "must not be negative, got %s", s.MaxWait)
	}
	for i, code := range s.ReleaseOn {
		if code < 100 || code > 599 {
			add(fmt.Sprintf("%srelease_on[%d]", path, i), "must be an HTTP status between 100 and 599, got %d", code)
		}
	}
	if s.MaxRequestBody <= 0 {
		add(path+"max_request_body", "must be positive, got %d", s.MaxRequestBody)
	}
	if s.MaxResponseBody <= 0 {
		add(path+"max_response_body", "must be positive, got %d", s.MaxResponseBody)
	}
	for i, h := range s.Fingerprint.Headers {
		if !validToken(h) {
			add(fmt.Sprintf("%sfingerprint.headers[%d]", path, i), "%q is not a valid header name", h)
		}
	}
	for i, p := range s.Fingerprint.IgnoreJSONFields {
		if _, err := jsonpointer.Parse(p); err != nil {
			add(fmt.Sprintf("%sfingerprint.ignore_json_fields[%d]", path, i), "%v", err)
		}
	}
	if u := s.Replay.AuthorizeURL; u != "" {
		if _, ok := httpURL(u); !ok {
			add(path+"replay.authorize_url", "must be an absolute http or https URL, got %q", u)
		}
	}
	for i, h := range s.ResponseHeaders.Exclude {
		if !validToken(h) {
			add(fmt.Sprintf("%sresponse_headers.exclude[%d]", path, i), "%q is not a valid header name", h)
		}
	}
	if s.Quota.NewKeys < 0 {
		add(path+"quota.new_keys", "must not be negative, got %d", s.Quota.NewKeys)
	}
	if s.Quota.NewKeys > 0 && s.Quota.Window < time.Second {
		add(path+"quota.window", "must be at least 1s when quota.new_keys is set, got %s", s.Quota.Window)
	}
	if s.Replay.AuthorizeTimeout <= 0 {
		add(path+"replay.authorize_timeout", "must be positive, got %s", s.Replay.AuthorizeTimeout)
	}
}

func oneOf(path, got string, add func(path, format string, args ...any), allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	add(path, "must be one of %s, got %q", strings.Join(allowed, ", "), got)
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

// validToken reports whether s is an RFC 9110 token, as header names and
// methods must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

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

// Warnings are settings that are valid but dangerous enough to say so at
// every start: each names its key.
func (c *Config) Warnings() []string {
	var w []string
	if len(c.Routes) == 0 {
		w = append(w, "routes: none: every request is forwarded unprotected; list the endpoints to protect under routes:")
	}
	for i, p := range c.Identity.TrustedProxies {
		if p.Bits() == 0 {
			w = append(w, fmt.Sprintf("identity.trusted_proxies[%d]: %s trusts every peer: any client can send %s and be any principal, and read another principal's replays; list only the auth proxy or mesh in the pod", i, p, c.Identity.Header))
		}
	}
	for _, all := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		if covers(c.Identity.TrustedProxies, all) && !slices.ContainsFunc(c.Identity.TrustedProxies, func(p netip.Prefix) bool { return p.Bits() == 0 && p.Addr().Is4() == all.Addr().Is4() }) {
			w = append(w, fmt.Sprintf("identity.trusted_proxies: together the prefixes cover every %s address: any client can send %s and be any principal; list only the auth proxy or mesh in the pod", map[bool]string{true: "IPv4", false: "IPv6"}[all.Addr().Is4()], c.Identity.Header))
		}
	}
	if len(c.Store.Encryption.KeyFiles) > 1 && c.Store.KeySecretFile == "" {
		w = append(w, "store.encryption.key_files: several keys and no store.key_secret_file: Redis keys are derived from the first key file, so prepending a key moves every key; records stored before are no longer found and their retries execute again; set store.key_secret_file before rotating")
	}
	switch {
	case c.Store.Compression == CompressionZstd && c.Store.RecordFormat < 3:
		w = append(w, "store.compression: zstd is written only under store.record_format: 3 (releases before v0.5.0 cannot read compressed records): set 3 once every replica runs v0.5.0 or later")
	case c.Store.KeySecretFile != "" && c.Store.RecordFormat < 2:
		w = append(w, "store.record_format: 1: fingerprints are stored as plain SHA-256, which someone who reads Redis can check guessed request bodies against; set 2 (keyed with store.key_secret_file) once every replica runs v0.4.0 or later (CHANGELOG.md)")
	}
	if c.Tracing.TrustIncoming == TraceTrustAll {
		w = append(w, "tracing.trust_incoming: all: any client's traceparent parents idemproxy's spans and can force them sampled (and exported); trusted_peers keeps that to the proxies in identity.trusted_proxies")
	}
	for i, p := range c.PassThroughUpgrades {
		if !strings.EqualFold(p, "websocket") {
			w = append(w, fmt.Sprintf("pass_through_upgrades[%d]: %s is tunnelled for every peer: an upstream that goes on parsing HTTP inside the tunnel (h2c) reads headers idemproxy never stripped", i, p))
		}
	}
	if len(c.Store.Encryption.KeyFiles) > 0 && !c.Store.Encryption.Required {
		w = append(w, "store.encryption.required: false with key_files: an unsealed record planted in Redis is replayed as it is; keep it only while records written before sealing can exist (one retention), then remove it (true is the default with key_files)")
	}
	for i, r := range c.Routes {
		if r.Webhook.Provider == "" || r.set == nil {
			continue
		}
		if !r.set["quota.new_keys"] && c.Defaults.Quota.NewKeys > 0 {
			w = append(w, fmt.Sprintf("routes[%d].quota.new_keys: not set, so defaults.quota.new_keys (%d) does not apply to this webhook route (%s): every delivery is the provider's, and a busy provider would be refused 429 too-many-keys past %d events a window; set it on the route to bound the provider's new keys", i, c.Defaults.Quota.NewKeys, r.Name, c.Defaults.Quota.NewKeys))
		}
		if r.set["scope"] && r.Settings.Scope == ScopePrincipal {
			w = append(w, fmt.Sprintf("routes[%d].scope: principal is not applied to a webhook route (%s): its deliveries are always scoped by route; records v0.5.0 stored under the shared scope are still read for one retention", i, r.Name))
		}
	}
	if c.Defaults.Quota.NewKeys == 0 {
		for i, r := range c.Routes {
			if r.Settings.Quota.NewKeys == 0 && r.Webhook.Provider == "" {
				w = append(w, fmt.Sprintf("routes[%d].quota.new_keys: 0 (%s): one principal can claim new keys without bound and fill the store for the whole retention (503 store-full for everyone); set defaults.quota.new_keys (docs/security.md, Trust rules, sizes it)", i, r.Name))
			}
		}
	}
	if len(c.Store.Redis.Addrs) == 0 {
		w = append(w, "store.redis.addrs: empty: the embedded in-memory store is in use: single instance, not durable, no authentication, lost on every restart (a retry after a restart executes again); development only, set store.redis.addrs in production")
	}
	w = append(w, c.exposedSecrets(os.Getgroups)...)
	if need := c.Upstream.Budget(); c.Drain.Timeout > 0 && c.Drain.Timeout < need {
		w = append(w, fmt.Sprintf("drain.timeout: %s is shorter than upstream.timeout + upstream.late_answer_window (%s): a rollout can cut off a request still upstream after the upstream acted; its key is then settled by unknown_outcome (keep: a retry may execute again once the lease lapses; fail: retries get 502 outcome-unknown) instead of its answer being stored; 0 waits %s", c.Drain.Timeout, need, need+DrainExtra))
	}
	if c.Upstream.LateAnswerWindow > 0 && c.Upstream.MaxLateCalls == 0 {
		w = append(w, "upstream.max_late_calls: 0 holds no late call: upstream.late_answer_window has no effect, every call is cancelled at upstream.timeout")
	}
	return w
}

// loopbackAddr checks that addr is host:port with a loopback host, so that
// what listens there is reachable only from inside the pod.
func loopbackAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("must be a loopback host:port like 127.0.0.1:6060, got %q", addr)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address: pprof's profiles and heap dumps hold request contents; use 127.0.0.1:6060 or [::1]:6060 and reach it with kubectl port-forward", addr)
}

// covers reports whether the union of prefixes contains all of p.
func covers(prefixes []netip.Prefix, p netip.Prefix) bool {
	for _, q := range prefixes {
		if q.Addr().Is4() == p.Addr().Is4() && q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	if p.Bits() >= p.Addr().BitLen() {
		return false
	}
	// Split p in halves; a half no prefix reaches into ends the search.
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	hiAddr := p.Addr().AsSlice()
	hiAddr[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	hi, _ := netip.AddrFromSlice(hiAddr)
	return reaches(prefixes, lo) && reaches(prefixes, netip.PrefixFrom(hi, p.Bits()+1)) &&
		covers(prefixes, lo) && covers(prefixes, netip.PrefixFrom(hi, p.Bits()+1))
}

// reaches reports whether some prefix overlaps p.
func reaches(prefixes []netip.Prefix, p netip.Prefix) bool {
	for _, q := range prefixes {
		if q.Overlaps(p) {
			return true
		}
	}
	return false
}

// ownListener returns the key and address of the listener u points at,
// when u is on this host (loopback, localhost or the listener's own host)
// and on a port idemproxy itself listens on.
func ownListener(u *url.URL, listen, admin string) (key, addr string) {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	host := u.Hostname()
	local := strings.EqualFold(host, "localhost")
	if ip, err := netip.ParseAddr(host); err == nil {
		local = ip.IsLoopback() || ip.IsUnspecified()
	}
	for _, l := range []struct{ key, addr string }{{"listen", listen}, {"admin_listen", admin}} {
		lhost, lport, err := net.SplitHostPort(l.addr)
		if err != nil || lport != port || lport == "0" {
			continue
		}
		if local || strings.EqualFold(lhost, host) {
			return l.key, l.addr
		}
	}
	return "", ""
}

// exposedSecrets warns about each secret file that users other than this
// process can read: readable by everyone, or by a group this process is
// not in (groups lists its supplementary groups). A Kubernetes Secret
// mounted with defaultMode 0440 and the pod's fsGroup is readable by that
// group, which the process is in: no warning. Secret mounts are symlinks:
// Stat judges the file they lead to.
func (c *Config) exposedSecrets(groups func() ([]int, error)) []string {
	files := []struct{ key, path string }{
		{"store.redis.password_file", c.Store.Redis.PasswordFile},
		{"store.redis.sentinel_password_file", c.Store.Redis.SentinelPasswordFile},
		{"store.key_secret_file", c.Store.KeySecretFile},
		{"admin.token_file", c.Admin.TokenFile},
	}
	for i, f := range c.Store.Encryption.KeyFiles {
		files = append(files, struct{ key, path string }{fmt.Sprintf("store.encryption.key_files[%d]", i), f})
	}
	for i, r := range c.Routes {
		for j, f := range r.Webhook.SecretFiles {
			files = append(files, struct{ key, path string }{fmt.Sprintf("routes[%d].webhook.secret_files[%d]", i, j), f})
		}
	}
	mine, _ := groups()
	var out []string
	for _, f := range files {
		if f.path == "" {
			continue
		}
		fi, err := os.Stat(f.path)
		if err != nil {
			continue // reading it reports that
		}
		mode, gid := fi.Mode().Perm(), -1
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			gid = int(st.Gid)
		}
		switch {
		case mode&0o004 != 0:
			out = append(out, fmt.Sprintf("%s: %s is readable by every user on this host (mode %s): make it 0400, or 0440 with the pod's fsGroup (a Kubernetes Secret volume: defaultMode: 0440)", f.key, f.path, mode))
		case mode&0o040 != 0 && gid != os.Getgid() && !slices.Contains(mine, gid):
			out = append(out, fmt.Sprintf("%s: %s is readable by group %d, which this process is not in (mode %s): make it 0400, or give it this process' group", f.key, f.path, gid, mode))
		}
	}
	return out
}

func (w Webhook) validate(path string, add problemf) {
	if w.Provider == "" {
		if len(w.SecretFiles) > 0 {
			add(path+"provider", "must be set with secret_files: stripe, github, shopify or standard")
		}
		return
	}
	oneOf(path+"provider", w.Provider, add, WebhookProviders...)
	if len(w.SecretFiles) == 0 && len(w.Secrets) == 0 { // Secrets: a route built in code (the demo)
		add(path+"secret_files", "must name at least one file holding the provider's signing secret")
	}
	if w.Tolerance <= 0 || w.Tolerance > time.Hour {
		add(path+"tolerance", "must be between 1s and 1h (a signed timestamp further off is refused: replay protection), got %s", w.Tolerance)
	}
}
