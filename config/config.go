// Package config loads and validates idemproxy's YAML configuration.
//
// Every key is declared once, as a tagged field of Config (see keys.go);
// decoding, the environment overrides, the unknown-key check, the list of
// keys that need a restart and docs/configuration.md's reference table come from
// those declarations. Every key outside routes: can be overridden from the
// environment as IDEMPROXY_ followed by its upper-cased path with dots
// replaced by underscores, for example IDEMPROXY_STORE_REDIS_PASSWORD or
// IDEMPROXY_DEFAULTS_LEASE (lists as comma-separated values). Routes come
// from the file only.
package config

import (
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"time"
)

// Default values for every key. A route inherits defaults: which in turn
// starts from these.
const (
	DefaultListen            = ":8080"
	DefaultAdminListen       = ":9090"
	DefaultUpstreamURL       = "http://127.0.0.1:3000"
	DefaultUpstreamTimeout   = 30 * time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultLateAnswerWindow  = 5 * time.Minute
	DefaultMaxLateCalls      = 1000
	DefaultLogLevel          = "info"
	DefaultKeyPrefix         = "idem:"
	DefaultWaitTimeout       = 100 * time.Millisecond
	DefaultIdentityHeader    = "X-Forwarded-User"
	DefaultKeyHeader         = "Idempotency-Key"
	DefaultRequireKey        = true
	DefaultScope             = ScopeRoute
	DefaultRetention         = 24 * time.Hour
	DefaultLease             = 10 * time.Second
	DefaultConcurrent        = ConcurrentReject
	DefaultMaxWait           = 5 * time.Second
	DefaultUnknownOutcome    = OutcomeFail
	// DefaultJWTLeeway is identity.jwt.leeway.
	DefaultJWTLeeway        = 30 * time.Second
	DefaultStoreUnavailable = FailClosed
	DefaultMaxRequestBody   = 1 << 20
	DefaultMaxResponseBody  = 1 << 20
	DefaultAuthorizeTimeout = time.Second
	DefaultClaimMemoryLimit = 0.9
	DefaultQuotaWindow      = time.Hour
	DefaultPrincipalShare   = 0.25
	// DefaultFirstSentSkew is defaults.first_sent_skew.
	DefaultFirstSentSkew = 2 * time.Second

	// MinLease is the shortest lease accepted. A shorter lease would expire
	// between two renewals on a loaded machine and hand the key to a retry
	// while the first attempt is still running.
	MinLease = time.Second
)

// DefaultTrustedProxies are the peers whose identity header is honoured when
// identity.trusted_proxies is not set: the pod's own loopback, where a mesh
// or auth proxy sidecar connects from.
var DefaultTrustedProxies = []string{"127.0.0.0/8", "::1/128"}

// DefaultStripFromUntrusted are the trust-bearing headers besides the
// identity header, Forwarded and X-Forwarded-For (which ReverseProxy
// already replaces) that an untrusted peer may not hand to the upstream.
var DefaultStripFromUntrusted = []string{"X-Real-Ip", "X-Client-Ip", "True-Client-Ip", "X-Forwarded-Host",
	"X-Forwarded-Proto", "X-Forwarded-Client-Cert", "X-Original-Forwarded-For"}

// DefaultReleaseOn are the upstream statuses that declare the request was not
// acted upon, so the claim is released and a retry really retries.
var DefaultReleaseOn = []int{429, 503}

// DefaultFingerprintHeaders are the request headers that take part in the
// fingerprint unless configured otherwise.
var DefaultFingerprintHeaders = []string{"Content-Type"}

// First-sent sources (defaults.first_sent).
const (
	FirstSentHeader = "header"
	FirstSentUUIDv7 = "uuidv7"
)

// FirstSentSources are the values defaults.first_sent lists.
var FirstSentSources = []string{FirstSentHeader, FirstSentUUIDv7}

// Identity sources: how the identity header carries the principal.
const (
	IdentityFromHeader = "header" // the header's value is the principal
	IdentityFromXFCC   = "xfcc"   // the URI SAN in X-Forwarded-Client-Cert
	IdentityFromJWT    = "jwt"    // a claim of a verified bearer token
)

// IdentitySources are the values identity.source accepts.
var IdentitySources = []string{IdentityFromHeader, IdentityFromXFCC, IdentityFromJWT}

// JWT verifies bearer tokens (identity.source: jwt).
type JWT struct {
	// JWKSURL serves the issuer's public keys; fetched again when a token
	// names a key it does not list (rotation), at most once a second.
	JWKSURL string `yaml:"jwks_url"`
	// Issuer is the iss every token must carry.
	Issuer string `yaml:"issuer"`
	// Audience lists the aud values accepted (one must match).
	Audience []string `yaml:"audience"`
	// Claim holds the principal.
	Claim string `yaml:"claim"`
	// Leeway is how far past its exp (and before its nbf) a token is
	// still accepted, for clock skew with the issuer.
	Leeway time.Duration `yaml:"leeway"`
}

// Scope values: which identities share a key space.
const (
	ScopeRoute     = "route"     // principal + route + key
	ScopePrincipal = "principal" // principal + key, shared across routes
)

// Concurrent values: what a retry does while the first attempt runs.
const (
	ConcurrentReject = "reject" // 409 with Retry-After
	ConcurrentWait   = "wait"   // wait up to max_wait for the outcome
)

// UnknownOutcome values: what happens to the claim when the upstream may
// have received the request but gave no answer.
const (
	OutcomeKeep    = "keep"    // hold the claim one more lease, then let it lapse
	OutcomeRelease = "release" // free the key at once
	// OutcomeFail stores a replayable 502 outcome-unknown for the key, so
	// nothing executes again; a claim whose owner vanished is settled the
	// same way by the next attempt that finds it.
	OutcomeFail = "fail"
)

// UnknownOutcomes are the values unknown_outcome accepts.
var UnknownOutcomes = []string{OutcomeKeep, OutcomeRelease, OutcomeFail}

// StoreUnavailable values: what happens when Redis cannot be reached.
const (
	FailClosed = "fail_closed" // 503 + Retry-After, nothing forwarded
	FailOpen   = "fail_open"   // forward unprotected, counted and logged
)

// Config is the whole configuration of one idemproxy process.
type Config struct {
	// Listen is the client-facing address.
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz and /readyz.
	AdminListen string `yaml:"admin_listen"`
	// AdminPprofListen, when set, serves net/http/pprof under
	// /debug/pprof/ on its own listener, which must be a loopback address:
	// profiles and heap dumps hold request contents. Empty serves none.
	AdminPprofListen string `yaml:"admin_pprof_listen"`
	// LogLevel is the least severe level logged: debug, info, warn or
	// error. One line per protected request is logged at info; warn keeps
	// only the anomalies. It reloads.
	LogLevel string `yaml:"log_level" reload:"true"`
	// Client bounds how long a client may take to send a request.
	Client Client `yaml:"client"`
	// Limits bound the body buffers of the process.
	Limits Limits `yaml:"limits"`
	// Problems shapes the problem+json answers.
	Problems Problems `yaml:"problems"`
	// Tracing turns OpenTelemetry traces on.
	Tracing Tracing `yaml:"tracing"`
	// Admin configures the admin port's key API and readiness.
	Admin Admin `yaml:"admin"`
	// Upstream is the app in the pod.
	Upstream Upstream `yaml:"upstream"`
	// Store is the Redis deployment holding the claims.
	Store Store `yaml:"store"`
	// Drain shapes the shutdown on SIGTERM.
	Drain Drain `yaml:"drain"`
	// Identity says where the principal comes from and whom to trust.
	Identity Identity `yaml:"identity"`
	// PassThroughUpgrades are the Upgrade protocols forwarded on
	// unprotected paths; protected routes refuse every Upgrade.
	PassThroughUpgrades []string `yaml:"pass_through_upgrades"`
	// Defaults are inherited by every route.
	Defaults Settings `yaml:"defaults" reload:"true"`
	// Routes are the protected endpoints, decoded from routes: (they
	// reload).
	Routes []Route `yaml:"-"`
}

// Admin configures the admin port's key API.
type Admin struct {
	// TokenFile, when set, enables /v1/keys on the admin port, for
	// requests bearing the token it holds (at least 16 characters).
	TokenFile string `yaml:"token_file"`
	// ReadinessRequiresStore makes /readyz fail while the store watcher
	// sees a Redis master down. False (the default): readiness is the
	// sidecar's own (listeners bound, config loaded, not draining), so a
	// Redis outage does not take the pod, and its pass-through traffic,
	// out of its Service.
	ReadinessRequiresStore bool `yaml:"readiness_requires_store"`
}

// Tracing configures OpenTelemetry traces.
type Tracing struct {
	// Enabled exports traces over OTLP/HTTP, configured by the standard
	// OTEL_* environment variables (endpoint, headers, sampler, service
	// name). Setting OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT enables tracing as well;
	// OTEL_SDK_DISABLED=true turns it off whatever this says.
	Enabled bool `yaml:"enabled"`
	// TrustIncoming says whose traceparent may parent idemproxy's spans:
	// trusted_peers (identity.trusted_proxies), all or none. Another
	// peer's is at most a link, never forces sampling, and its tracestate
	// and baggage are dropped.
	TrustIncoming string `yaml:"trust_incoming"`
}

// Values of tracing.trust_incoming.
const (
	TraceTrustTrustedPeers = "trusted_peers"
	TraceTrustAll          = "all"
	TraceTrustNone         = "none"
)

// Problems configures the problem+json answers.
type Problems struct {
	// TypeBaseURL starts every problem type, e.g. a documentation site
	// with a page per type; empty uses urn:idemproxy:problem:.
	TypeBaseURL string `yaml:"type_base_url"`
	// DocsURL, when set, is linked from every 400, 409 and 422 answer as
	// Link: <...>; rel="describedby".
	DocsURL string `yaml:"docs_url"`
}

// Limits bound what the process holds.
type Limits struct {
	// MaxBufferedBytes bounds the bytes held in request and response body
	// buffers at once. Zero derives it from GOMEMLIMIT (half of it) when
	// that is set, and holds without limit otherwise.
	MaxBufferedBytes int64 `yaml:"max_buffered_bytes"`
	// PrincipalShare is the most of MaxBufferedBytes one principal's
	// requests may hold at once; 0 gives no share of its own.
	PrincipalShare float64 `yaml:"principal_share"`
}

// Client bounds how long a client may take to send its request, so that
// a slow or stalled client holds neither a handler nor an upstream
// connection for long.
type Client struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// BodyTimeout bounds a request body: a protected one is read whole
	// before the claim and must arrive within it; a pass-through one is
	// streamed and may not pause longer than it.
	BodyTimeout time.Duration `yaml:"body_timeout"`
}

// Upstream is the application idemproxy protects.
type Upstream struct {
	// URL is the upstream's base URL, e.g. http://127.0.0.1:3000.
	URL string `yaml:"url"`
	// Timeout is how long a client waits for the upstream's answer; past
	// it the client gets 504 and, with a LateAnswerWindow, the upstream
	// call goes on.
	Timeout time.Duration `yaml:"timeout"`
	// LateAnswerWindow is how much longer than Timeout the owner keeps the
	// upstream call open, renewing its lease, to store a late answer for
	// the client's retries. Zero cancels the call at Timeout.
	LateAnswerWindow time.Duration `yaml:"late_answer_window"`
	// MaxLateCalls caps the calls running past Timeout at once in this
	// process; beyond it a call is cancelled at Timeout and its route's
	// unknown_outcome applies. Zero holds none.
	MaxLateCalls int `yaml:"max_late_calls"`
	// LateCallsPrincipalShare is the most of MaxLateCalls one principal's
	// calls may hold; beyond it, that principal's call is the one cancelled
	// at Timeout. Zero: no share of its own.
	LateCallsPrincipalShare float64 `yaml:"late_calls_principal_share"`
	// HealthPath, when set, is the app's own health endpoint (e.g.
	// /healthz), which idemproxy probes on the upstream and serves on its
	// admin port as /app/readyz, for the app container's readiness probe:
	// the app listens on localhost only, where a kubelet probe cannot
	// reach it. Empty: /app/readyz answers 404.
	HealthPath string `yaml:"health_path"`
}

// Budget is the longest a protected request may run upstream: Timeout
// plus LateAnswerWindow.
func (u Upstream) Budget() time.Duration { return u.Timeout + u.LateAnswerWindow }

// Drain configures shutdown on SIGTERM.
type Drain struct {
	// Delay is how long /readyz fails before the client listener stops
	// accepting, so load balancers stop sending first. Zero stops at once.
	Delay time.Duration `yaml:"delay"`
	// Timeout bounds how long in-flight requests, late calls included, may
	// take to settle and store after the listener stopped; what still runs
	// then is settled by its route's unknown_outcome. Zero means
	// upstream.timeout plus upstream.late_answer_window plus 5s: a request
	// that just started may run that long.
	Timeout time.Duration `yaml:"timeout"`
}

// DrainExtra is added to the upstream budget for the default drain
// timeout: an in-flight request may run that long and then store.
const DrainExtra = 5 * time.Second

// Grace is how long a drain waits for in-flight requests: Drain.Timeout,
// or when zero, the upstream budget plus DrainExtra.
func (c *Config) Grace() time.Duration {
	if c.Drain.Timeout > 0 {
		return c.Drain.Timeout
	}
	return c.Upstream.Budget() + DrainExtra
}

// Store configures Redis.
type Store struct {
	// Redis says how to reach the deployment.
	Redis Redis `yaml:"redis"`
	// RecordFormat is the stored format written: 1 (what v0.3.0 reads,
	// the default), 2 (fingerprints keyed with KeySecretFile: turn it on
	// once every replica runs v0.4.0 or later) or 3 (2, plus compact
	// completed records and compressed bodies with Compression: once
	// every replica runs v0.5.0 or later).
	// Every version reads the formats before it.
	RecordFormat int `yaml:"record_format"`
	// Compression is none or zstd: completed bodies from 256 bytes on
	// stored zstd-compressed, written only under RecordFormat 3.
	Compression string `yaml:"compression"`
	// KeyPrefix is prepended to every Redis key.
	KeyPrefix string `yaml:"key_prefix"`
	// Pipeline coalesces concurrent store operations into pipelines
	// (group commit); false sends each on its own. No effect with
	// WaitReplicas, whose WAIT would hold up a whole batch.
	Pipeline bool `yaml:"pipeline"`
	// WaitReplicas, when positive, makes every claim and completion wait
	// for that many replicas to acknowledge it (Redis WAIT), up to
	// WaitTimeout. Zero never waits. Not consensus. On a Cluster the WAIT
	// goes to the key's master.
	WaitReplicas int `yaml:"wait_replicas"`
	// WaitTimeout bounds each WAIT.
	WaitTimeout time.Duration `yaml:"wait_timeout"`
	// ClaimMemoryLimit is the share of Redis' maxmemory above which new
	// claims are refused (503 store-full) so that claims in flight can
	// still store their outcome; 0 refuses none. Without a maxmemory it
	// has no effect.
	ClaimMemoryLimit float64 `yaml:"claim_memory_limit"`
	// Encryption seals what records hold of the upstream's answers.
	Encryption Encryption `yaml:"encryption"`
	// KeySecretFile, when set, holds the secret (base64) that keys the
	// derivation of Redis keys (HMAC-SHA-256); without it, with encryption
	// on, a subkey of the first key file is used.
	KeySecretFile string `yaml:"key_secret_file"`
}

// Encryption configures sealed records.
type Encryption struct {
	// KeyFiles each hold 32 random bytes, base64-encoded. The first seals,
	// all open: rotate by prepending a new key, and drop the old one once
	// retention has passed. Empty stores records unsealed.
	KeyFiles []string `yaml:"key_files"`
	// Required makes an unsealed record unreadable (500 record-unreadable)
	// instead of trusted.
	Required bool `yaml:"required"`
}

// Redis is the connection to the Redis deployment.
type Redis struct {
	// Addrs empty selects the embedded in-memory store (development only);
	// one address is a standalone server; several are a Cluster.
	Addrs []string `yaml:"addrs"`
	// MasterName set selects Sentinel, with Addrs naming the sentinels.
	MasterName string `yaml:"master_name"`
	// Username is the ACL user of the data nodes.
	Username string `yaml:"username"`
	// Password is the data nodes' password (prefer PasswordFile).
	Password string `yaml:"password"`
	// PasswordFile, when set, holds the password (a mounted Secret); it is
	// read at start, surrounding whitespace removed.
	PasswordFile string `yaml:"password_file"`
	// SentinelUsername and SentinelPassword (or SentinelPasswordFile)
	// authenticate to the sentinels when theirs differ from the data
	// nodes'; when all are empty the data nodes' credentials are used.
	SentinelUsername     string `yaml:"sentinel_username"`
	SentinelPassword     string `yaml:"sentinel_password"`
	SentinelPasswordFile string `yaml:"sentinel_password_file"`
	// TLS connects with TLS, verifying the server against TLSCAFile (PEM;
	// empty uses the system roots) and TLSServerName (empty uses the host
	// of the address).
	TLS           bool   `yaml:"tls"`
	TLSCAFile     string `yaml:"tls_ca_file"`
	TLSServerName string `yaml:"tls_server_name"`
}

// Identity configures where the principal comes from.
type Identity struct {
	// Header carries the authenticated principal, set by an auth proxy.
	Header string `yaml:"header"`
	// Source is where the principal comes from: header (Header's value is
	// the principal), xfcc (Envoy's X-Forwarded-Client-Cert; the principal
	// is the URI SAN, spiffe://..., of the connecting peer, and Header is
	// ignored) or jwt (a claim of a bearer token in Authorization, verified
	// against the issuer's keys: see JWT).
	Source string `yaml:"source"`
	// JWT configures source: jwt.
	JWT JWT `yaml:"jwt"`
	// TrustedProxies are the peers whose Header is honoured; from any other
	// peer the header is removed before anything reads it.
	TrustedProxies []netip.Prefix `yaml:"trusted_proxies"`
	// StripFromUntrusted are trust-bearing headers removed, under every
	// spelling, from the requests of peers not in TrustedProxies.
	StripFromUntrusted []string `yaml:"strip_from_untrusted"`
}

// Settings are the per-route knobs. defaults: sets them for all routes and
// each route may override any of them.
type Settings struct {
	// KeyHeader names the header carrying the idempotency key.
	KeyHeader string `yaml:"key_header"`
	// RequireKey refuses a request without a key (400); false forwards it
	// unprotected.
	RequireKey bool `yaml:"require_key"`
	// Scope is ScopeRoute (keys are per principal and route) or
	// ScopePrincipal (per principal, shared by every such route).
	Scope string `yaml:"scope"`
	// Retention is how long a settled answer is replayed.
	Retention time.Duration `yaml:"retention"`
	// Lease is how long a claim holds without renewal; the owner renews
	// it every Lease/3 while the upstream runs.
	Lease time.Duration `yaml:"lease"`
	// Concurrent is "reject" (a retry while the first attempt runs gets
	// the in-progress answer) or "wait" (it waits up to MaxWait).
	Concurrent string `yaml:"concurrent"`
	// MaxWait bounds a waiting retry (Concurrent "wait").
	MaxWait time.Duration `yaml:"max_wait"`
	// ReleaseOn are the upstream statuses that free the key unstored:
	// the upstream declares it did not act.
	ReleaseOn []int `yaml:"release_on"`
	// UnknownOutcome is what a key whose upstream may have acted without
	// an answer becomes: "keep", "release" or "fail".
	UnknownOutcome string `yaml:"unknown_outcome"`
	// StoreUnavailable is "fail_closed" (503, nothing forwarded) or
	// "fail_open" (forwarded unprotected) when no claim can be made.
	StoreUnavailable string `yaml:"store_unavailable"`
	// MaxRequestBody caps a protected request's body (413 beyond).
	MaxRequestBody int64 `yaml:"max_request_body"`
	// MaxResponseBody caps a stored answer, headers included; a larger one
	// is passed on and stored without its body.
	MaxResponseBody int64 `yaml:"max_response_body"`
	// Fingerprint selects what identifies a request besides its method,
	// path, query and body.
	Fingerprint Fingerprint `yaml:"fingerprint"`
	// Replay configures re-authorization before a replay.
	Replay Replay `yaml:"replay"`
	// ResponseHeaders selects the upstream headers never stored.
	ResponseHeaders ResponseHeaders `yaml:"response_headers"`
	// Quota bounds the new keys one principal claims per window.
	Quota Quota `yaml:"quota"`
	// InProgressStatus is the status of the answer to a retry while the
	// first attempt runs: 409 (the IETF draft's), or 429 or 503, which
	// generic retrying clients retry; Retry-After either way.
	InProgressStatus int `yaml:"in_progress_status"`
	// MaxInFlight, when positive, bounds the first attempts of the route
	// one process forwards at once; beyond it a new key is answered 503
	// overloaded with Retry-After, its claim released, nothing forwarded.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxInFlightPrincipalShare is the most of MaxInFlight one principal's
	// first attempts hold at once (at least one); principals that hold
	// some leave as many free for those that hold none.
	MaxInFlightPrincipalShare float64 `yaml:"max_in_flight_principal_share"`
	// FirstSent says where a request's first-sent time comes from, in
	// order: header (Repeatability-First-Sent, an HTTP date) and uuidv7
	// (the key is a UUIDv7: its timestamp). A new claim for a request
	// first sent longer ago than the retention, or before the store lost
	// its data, is refused 412 instead of executed. Empty: never.
	FirstSent []string `yaml:"first_sent"`
	// FirstSentSkew is how far behind a client's clock may be: a request
	// first sent within it of the retention's edge or of the epoch's
	// start still executes.
	FirstSentSkew time.Duration `yaml:"first_sent_skew"`
	// KeyJSONPointer, when set, takes the key from this member of a JSON
	// body (a string, or an integer in decimal) when the key header is
	// absent; a request that has both must agree. It makes the route read
	// bodies before the key.
	KeyJSONPointer string `yaml:"key_json_pointer"`
	// ProblemBody, when set, is a Go text/template for the body of every
	// answer idemproxy makes itself on the route (internal/problemfmt's
	// Data), in ProblemContentType (application/json when empty); empty
	// answers problem+json.
	ProblemBody        string `yaml:"problem_body"`
	ProblemContentType string `yaml:"problem_content_type"`
	// AdvertiseRetention sets Idempotency-Retention (seconds; not a
	// standard header) on stored answers and replays.
	AdvertiseRetention bool `yaml:"advertise_retention"`
}

// Quota bounds how many new keys one principal may claim on a route per
// window, counted in Redis and shared by every replica.
type Quota struct {
	// NewKeys is how many new keys a window allows; 0 counts nothing.
	NewKeys int `yaml:"new_keys"`
	// Window starts at a principal's first new key and lasts this long.
	Window time.Duration `yaml:"window"`
}

// ResponseHeaders selects which upstream response headers are stored.
type ResponseHeaders struct {
	// Exclude are never stored and never replayed; the first client still
	// gets them. Session cookies belong to the attempt that got them.
	Exclude []string `yaml:"exclude"`
}

// DefaultResponseHeadersExclude are the response headers never stored.
var DefaultResponseHeadersExclude = []string{"Set-Cookie"}

// Replay configures re-authorization before a stored response is revealed.
type Replay struct {
	// AuthorizeURL, when set, is asked (GET, with the request's identity,
	// Authorization and Cookie headers, X-Original-Method and
	// X-Original-URI) before a replay, a 409 or a 422 reveals that the key
	// exists; 2xx allows it, 401/403 refuses it. Empty authorizes nothing
	// again: the stored response is replayed to its principal.
	AuthorizeURL string `yaml:"authorize_url"`
	// AuthorizeTimeout bounds that request.
	AuthorizeTimeout time.Duration `yaml:"authorize_timeout"`
}

// Fingerprint selects what, besides method, path, query and body, identifies
// a request.
type Fingerprint struct {
	// Headers are request headers hashed into the fingerprint; media types
	// are normalised.
	Headers []string `yaml:"headers"`
	// IgnoreJSONFields are JSON Pointers (RFC 6901) removed from JSON bodies
	// before hashing, for fields that change on every attempt.
	IgnoreJSONFields []string `yaml:"ignore_json_fields"`
}

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

	// set holds the setting keys the route's YAML gave, so a bad value it
	// inherited is reported once, at defaults:, not again for every route.
	// Nil (a Route built in code) validates every setting.
	set map[string]bool
}

// Record compressions (store.compression).
const (
	CompressionNone = "none"
	CompressionZstd = "zstd"
)

// Webhook providers (routes[].webhook.provider).
const (
	WebhookStripe   = "stripe"
	WebhookGitHub   = "github"
	WebhookShopify  = "shopify"
	WebhookStandard = "standard" // Standard Webhooks (standardwebhooks.com)
)

// WebhookProviders are the values routes[].webhook.provider accepts.
var WebhookProviders = []string{WebhookStripe, WebhookGitHub, WebhookShopify, WebhookStandard}

// DefaultWebhookTolerance is routes[].webhook.tolerance.
const DefaultWebhookTolerance = 5 * time.Minute

// Webhook is a route's webhook block.
type Webhook struct {
	// Provider is stripe, github, shopify or standard; empty: not a
	// webhook route.
	Provider string `yaml:"provider"`
	// SecretFiles hold the signing secrets; any one verifies (rotation).
	SecretFiles []string `yaml:"secret_files"`
	// Tolerance is how far a signed timestamp (stripe, standard) may be
	// from now.
	Tolerance time.Duration `yaml:"tolerance"`
	// Secrets are the files' contents, read at start, by -check and at a
	// reload (main's readWebhookSecrets); nil until then.
	Secrets [][]byte `yaml:"-"`
}

// Default returns a configuration holding every default and no routes.
func Default() *Config {
	c := &Config{
		Listen:      DefaultListen,
		AdminListen: DefaultAdminListen,
		LogLevel:    DefaultLogLevel,
		Upstream: Upstream{
			URL: DefaultUpstreamURL, Timeout: DefaultUpstreamTimeout,
			LateAnswerWindow: DefaultLateAnswerWindow, MaxLateCalls: DefaultMaxLateCalls, LateCallsPrincipalShare: DefaultPrincipalShare,
		},
		Store:               Store{RecordFormat: 1, Compression: CompressionNone, KeyPrefix: DefaultKeyPrefix, Pipeline: true, WaitTimeout: DefaultWaitTimeout, ClaimMemoryLimit: DefaultClaimMemoryLimit},
		Client:              Client{ReadHeaderTimeout: DefaultReadHeaderTimeout, BodyTimeout: DefaultBodyTimeout},
		Limits:              Limits{PrincipalShare: DefaultPrincipalShare},
		PassThroughUpgrades: []string{"websocket"},
		Tracing:             Tracing{TrustIncoming: TraceTrustTrustedPeers},
		Identity:            Identity{Header: DefaultIdentityHeader, Source: IdentityFromHeader, JWT: JWT{Claim: "sub", Leeway: DefaultJWTLeeway}, StripFromUntrusted: slices.Clone(DefaultStripFromUntrusted)},
		Defaults:            DefaultSettings(),
	}
	for _, p := range DefaultTrustedProxies {
		c.Identity.TrustedProxies = append(c.Identity.TrustedProxies, netip.MustParsePrefix(p))
	}
	return c
}

// DefaultSettings returns the built-in per-route settings.
func DefaultSettings() Settings {
	return Settings{
		KeyHeader:        DefaultKeyHeader,
		RequireKey:       DefaultRequireKey,
		Scope:            DefaultScope,
		Retention:        DefaultRetention,
		Lease:            DefaultLease,
		Concurrent:       DefaultConcurrent,
		MaxWait:          DefaultMaxWait,
		ReleaseOn:        append([]int(nil), DefaultReleaseOn...),
		UnknownOutcome:   DefaultUnknownOutcome,
		StoreUnavailable: DefaultStoreUnavailable,
		MaxRequestBody:   DefaultMaxRequestBody,
		MaxResponseBody:  DefaultMaxResponseBody,
		Fingerprint:      Fingerprint{Headers: append([]string(nil), DefaultFingerprintHeaders...)},
		Replay:           Replay{AuthorizeTimeout: DefaultAuthorizeTimeout},
		ResponseHeaders:  ResponseHeaders{Exclude: slices.Clone(DefaultResponseHeadersExclude)},
		Quota:            Quota{Window: DefaultQuotaWindow},
		InProgressStatus: http.StatusConflict,

		MaxInFlightPrincipalShare: DefaultPrincipalShare,
		FirstSent:                 []string{FirstSentHeader},
		FirstSentSkew:             DefaultFirstSentSkew,
	}
}

// SlogLevel is LogLevel as a slog.Level; info when LogLevel is not valid.
func (c *Config) SlogLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}
