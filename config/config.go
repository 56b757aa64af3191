// Package config loads and validates idemproxy's YAML configuration.
//
// Every key is declared once, as a tagged field of Config (declare.go);
// decoding, the environment overrides, the unknown-key check, the list of
// keys that need a restart and docs/configuration.md's reference table come from
// those declarations. Every key outside routes: can be overridden from the
// environment as IDEMPROXY_ followed by its upper-cased path with dots
// replaced by underscores, for example IDEMPROXY_STORE_REDIS_PASSWORD or
// IDEMPROXY_DEFAULTS_LEASE (lists as comma-separated values). Routes come
// from the file only.
//
// A file per section, each with its types, defaults and checks: config.go
// (the whole and the small sections: admin, tracing, problems, limits,
// client, drain), upstream.go, store.go, identity.go, settings.go (defaults:
// and what each route overrides), routes.go, webhook.go; validate.go runs
// the checks, warnings.go says what is valid but dangerous, decode.go reads
// the YAML and the environment (values.go: each kind of value), load.go and
// schema.go the file.
package config

import (
	"log/slog"
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
	DefaultWriteTimeout      = 30 * time.Second
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
	// DefaultPostgresStreamFlushInterval is defaults.stream_flush_interval
	// on the PostgreSQL store (0s on Redis): each store of a stream is a
	// commit there.
	DefaultPostgresStreamFlushInterval = 20 * time.Millisecond
	DefaultPrincipalShare              = 0.25
	// DefaultFirstSentSkew is defaults.first_sent_skew.
	DefaultFirstSentSkew = 2 * time.Second

	// MinLease is the shortest lease accepted. A shorter lease would expire
	// between two renewals on a loaded machine and hand the key to a retry
	// while the first attempt is still running.
	MinLease = time.Second
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

	// strayEnv are IDEMPROXY_* variables Load found that name no key
	// (warned about).
	strayEnv []string
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
	// WriteTimeout cuts a client that takes nothing of an answer for this
	// long (a replay, a stream it follows), so that an idle reader holds
	// neither a handler nor its buffers; it reloads.
	WriteTimeout time.Duration `yaml:"write_timeout" reload:"true"`
}

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
		Store:               Store{RecordFormat: 1, Compression: CompressionNone, KeyPrefix: DefaultKeyPrefix, Pipeline: true, WaitTimeout: DefaultWaitTimeout, ClaimMemoryLimit: DefaultClaimMemoryLimit, Postgres: Postgres{Schema: "idemproxy", CreateSchema: true, MaxConns: 32}},
		Client:              Client{ReadHeaderTimeout: DefaultReadHeaderTimeout, BodyTimeout: DefaultBodyTimeout, WriteTimeout: DefaultWriteTimeout},
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

// SlogLevel is LogLevel as a slog.Level; info when LogLevel is not valid.
func (c *Config) SlogLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}
