package main

import (
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"runtime/debug"
	"slices"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/problemfmt"
	"github.com/idemproxy/idemproxy/proxy"
)

// The one place that knows both the YAML config and the packages it
// configures: config validates, these translate, proxy and claim take
// their own typed options and import nothing from config.

// proxyConfig is cfg as the proxy serves it, with the webhook routes'
// secrets read by readSecrets. cfg is valid.
func proxyConfig(cfg *config.Config, hooks webhookSecrets) (proxy.Config, error) {
	u, err := url.Parse(cfg.Upstream.URL)
	if err != nil {
		return proxy.Config{}, fmt.Errorf("upstream.url: %w", err)
	}
	return proxy.Config{
		Upstream:                u,
		UpstreamTimeout:         cfg.Upstream.Timeout,
		BodyReadTimeout:         cfg.Client.BodyTimeout,
		WriteTimeout:            cfg.Client.WriteTimeout,
		LateAnswerWindow:        cfg.Upstream.LateAnswerWindow,
		MaxLateCalls:            cfg.Upstream.MaxLateCalls,
		LateCallsPrincipalShare: lateShare(cfg.Upstream),
		MaxBufferedBytes:        bufferBudget(cfg.Limits.MaxBufferedBytes),
		ProblemTypeBase:         cfg.Problems.TypeBaseURL,
		ProblemDocsURL:          cfg.Problems.DocsURL,
		PrincipalShare:          int64(cfg.Limits.PrincipalShare * float64(bufferBudget(cfg.Limits.MaxBufferedBytes))),
		Identity: proxy.Identity{
			Source:             proxy.IdentitySource(cfg.Identity.Source),
			Header:             cfg.Identity.Header,
			JWT:                jwtConfig(cfg.Identity),
			TrustedProxies:     slices.Clone(cfg.Identity.TrustedProxies),
			StripFromUntrusted: slices.Clone(cfg.Identity.StripFromUntrusted),
		},
		Routes:  proxyRoutes(cfg.Routes, hooks),
		Streams: cfg.Store.RecordFormat >= 4,
		// Both were parsed, validated and documented and never handed over
		// before v0.5.0: every Upgrade was refused, WebSocket included.
		PassThroughUpgrades: slices.Clone(cfg.PassThroughUpgrades),
		Problems:            problemFormat(cfg.Defaults),
	}, nil
}

// lateShare is upstream.late_calls_principal_share in calls: at least one
// when the share is set, so that every principal may have a late call.
func lateShare(u config.Upstream) int {
	if u.LateCallsPrincipalShare <= 0 {
		return 0
	}
	return max(1, int(u.LateCallsPrincipalShare*float64(u.MaxLateCalls)))
}

// problemFormat is s's problem_body, compiled; nil for problem+json.
// Validate parsed it already.
func problemFormat(s config.Settings) *problemfmt.Format {
	f, _ := problemfmt.Parse(s.ProblemBody, s.ProblemContentType)
	return f
}

// traceTrust is tracing.trust_incoming for the proxy.
func traceTrust(t config.Tracing) proxy.TraceTrust {
	switch t.TrustIncoming {
	case config.TraceTrustAll:
		return proxy.TraceTrustAll
	case config.TraceTrustNone:
		return proxy.TraceTrustNone
	}
	return proxy.TraceTrustTrustedPeers
}

// jwtConfig is identity.jwt for the proxy.
func jwtConfig(id config.Identity) proxy.JWTConfig {
	return proxy.JWTConfig{JWKSURL: id.JWT.JWKSURL, Issuer: id.JWT.Issuer, Audience: slices.Clone(id.JWT.Audience), Claim: id.JWT.Claim, Leeway: id.JWT.Leeway}
}

// bufferBudget is limits.max_buffered_bytes, or when it is zero half of
// GOMEMLIMIT (the rest is for the runtime, connections and the store
// client), or no limit when neither is set.
func bufferBudget(configured int64) int64 {
	if configured > 0 {
		return configured
	}
	if limit := debug.SetMemoryLimit(-1); limit < math.MaxInt64 {
		return limit / 2
	}
	return 0
}

// proxyRoutes compiles the routes' YAML settings into typed ones, each
// webhook route with its secrets from hooks.
func proxyRoutes(routes []config.Route, hooks webhookSecrets) []proxy.Route {
	out := make([]proxy.Route, 0, len(routes))
	for _, r := range routes {
		s := r.Settings
		var authorize *url.URL
		if s.Replay.AuthorizeURL != "" {
			authorize, _ = url.Parse(s.Replay.AuthorizeURL) // validated
		}
		unknown := unknownOutcomes[s.UnknownOutcome] // validated
		out = append(out, proxy.Route{
			Name:                r.Name,
			Pattern:             config.CanonicalPattern(r.Match),
			KeyHeader:           s.KeyHeader,
			RequireKey:          s.RequireKey,
			SharedScope:         s.Scope == config.ScopePrincipal,
			Retention:           s.Retention,
			Lease:               s.Lease,
			Wait:                s.Concurrent == config.ConcurrentWait,
			MaxWait:             s.MaxWait,
			ReleaseOn:           slices.Clone(s.ReleaseOn),
			Unknown:             unknown,
			FailOpen:            s.StoreUnavailable == config.FailOpen,
			MaxRequestBody:      s.MaxRequestBody,
			MaxResponseBody:     s.MaxResponseBody,
			FingerprintHeaders:  slices.Clone(s.Fingerprint.Headers),
			IgnoreJSONFields:    slices.Clone(s.Fingerprint.IgnoreJSONFields),
			AuthorizeURL:        authorize,
			AuthorizeTimeout:    s.Replay.AuthorizeTimeout,
			ExcludeHeaders:      slices.Clone(s.ResponseHeaders.Exclude),
			QuotaNewKeys:        int64(s.Quota.NewKeys),
			AdvertiseRetention:  s.AdvertiseRetention,
			InProgressStatus:    s.InProgressStatus,
			MaxInFlight:         s.MaxInFlight,
			MaxInFlightShare:    shareOf(s.MaxInFlight, s.MaxInFlightPrincipalShare),
			FirstSent:           firstSentSources(s.FirstSent),
			Webhook:             webhookOf(r.Webhook, hooks[r.Name]),
			Reconcile:           reconcileOf(r.Reconcile),
			Stream:              r.Stream != config.StreamOff && r.Webhook.Provider == "",
			FirstSentSkew:       s.FirstSentSkew,
			StreamFlushInterval: s.StreamFlushInterval,
			KeyJSONPointer:      s.KeyJSONPointer,
			Protocol:            r.Protocol,
			GRPCKeyField:        r.GRPC.KeyField,
			GRPCRelease:         grpcCodes(r.GRPC.ReleaseCodes),
			Problems:            problemFormat(s),
			QuotaWindow:         s.Quota.Window,
		})
	}
	return out
}

// clientOptions is how claim reaches the Redis r names; its password
// files must have been read into r already (readSecrets).
func clientOptions(r config.Redis) redisstore.ClientOptions {
	return redisstore.ClientOptions{
		Addrs:            slices.Clone(r.Addrs),
		MasterName:       r.MasterName,
		Username:         r.Username,
		Password:         r.Password,
		SentinelUsername: r.SentinelUsername,
		SentinelPassword: r.SentinelPassword,
		TLS:              r.TLS,
		TLSCAFile:        r.TLSCAFile,
		TLSServerName:    r.TLSServerName,
	}
}

// streamReadLimit is the longest streamed record a claim reads back: no
// owner stores more than its route's max_response_body of a stream, with
// its head (headers, bounded by it too) and, sealed, a frame's overhead
// per chunk; four times the largest bound, and 1 MiB, leave room for
// every stream stored, and keep one planted past that out of memory. A
// route's exact bound is checked after the read (proxy). Routes reload,
// this does not: a bound raised by a reload reads back up to four times
// the old one until a restart.
func streamReadLimit(cfg *config.Config) int {
	largest := cfg.Defaults.MaxResponseBody
	for _, r := range cfg.Routes {
		largest = max(largest, r.Settings.MaxResponseBody)
	}
	return int(min(4*largest+1<<20, 1<<40))
}

// storeOptions are the store's options (claim.Option): sealing and key derivation
// (read by readSecrets), WAIT and pipelining, with their metrics, and
// the streamed records a claim reads back.
func storeOptions(cfg *config.Config, sec *secrets, m *metrics, log *slog.Logger) []claim.Option {
	st := cfg.Store
	opts := append(slices.Clone(sec.store), claim.WithStreamReadLimit(streamReadLimit(cfg)))
	if wallClock != nil {
		opts = append(opts, claim.WithClock(wallClock))
	}
	opts = append(opts, claim.WithEpochObserver(func(e claim.Epoch) {
		lost := m.dataLost.WithLabelValues(e.Master) // exists at 0 from the first look, so that increase() sees the first loss
		if e.Lost {
			// Anomaly lines stay synchronous (the chaos checker reads them).
			lost.Inc()
			reason := e.Reason
			if reason == "" {
				reason = "the epoch marker is gone"
			}
			log.Error("the store lost its data: "+reason+"; a new epoch began, and requests first sent before it are refused 412 record-lost instead of executed again",
				"master", e.Master, "epoch_start", e.Start.UTC())
		}
	}))
	if st.WaitReplicas > 0 {
		opts = append(opts, claim.WithWait(st.WaitReplicas, st.WaitTimeout, func(op string) {
			m.waitShort.WithLabelValues(op).Inc()
		}))
	}
	if st.Redis.MasterName != "" {
		opts = append(opts, claim.WithNodeName(st.Redis.MasterName))
	}
	switch {
	case sec.keySecret != nil:
		opts = append(opts, claim.WithKeyedFingerprints(sec.keySecret, st.RecordFormat >= 2))
	case len(st.Encryption.KeyFiles) > 0:
		// Sealed records never carry a plain fingerprint under format 3;
		// any format reads the keyed ones.
		opts = append(opts, claim.WithDerivedFingerprints(st.RecordFormat >= 3))
	}
	if st.RecordFormat >= 5 {
		opts = append(opts, claim.WithStreamRows(true))
	}
	if st.RecordFormat >= 3 {
		opts = append(opts, claim.WithCompactRecords())
		if st.Compression == config.CompressionZstd {
			opts = append(opts, claim.WithCompression())
		}
	}
	return append(opts, claim.WithPipeline(st.Pipeline), claim.WithBatchObserver(func(n int) {
		m.batchOps.Observe(float64(n))
	}))
}

// shareOf is share of n, rounded up, at least 1 (0 when n is).
func shareOf(n int, share float64) int {
	if n <= 0 {
		return 0
	}
	return max(1, int(math.Ceil(float64(n)*share)))
}

// The proxy's value of each value config/ accepts for an enumerated
// setting (TestEveryConfigValueReachesTheProxy ties them; identity
// sources and webhook providers share their names, and proxy.New refuses
// one it does not know).
var (
	unknownOutcomes = map[string]proxy.Unknown{config.OutcomeKeep: proxy.Keep, config.OutcomeRelease: proxy.Release, config.OutcomeFail: proxy.Fail}
	firstSentByName = map[string]proxy.FirstSentSource{config.FirstSentHeader: proxy.FirstSentHeader, config.FirstSentUUIDv7: proxy.FirstSentUUIDv7}
)

// firstSentSources is defaults.first_sent for the proxy.
func firstSentSources(names []string) []proxy.FirstSentSource {
	out := make([]proxy.FirstSentSource, 0, len(names))
	for _, n := range names {
		out = append(out, firstSentByName[n]) // validated
	}
	return out
}

// reconcileOf is a route's reconcile block for the proxy; nil without a
// url.
func reconcileOf(rc config.Reconcile) *proxy.Reconcile {
	if rc.URL == "" {
		return nil
	}
	return &proxy.Reconcile{URL: rc.URL, Found: slices.Clone(rc.Found), Absent: slices.Clone(rc.Absent), Status: rc.Status, Timeout: rc.Timeout, AbsentAfter: rc.AbsentAfter}
}

// webhookOf is a route's webhook block for the proxy, with the secrets
// its files hold; nil without a provider.
func webhookOf(w config.Webhook, secrets [][]byte) *proxy.Webhook {
	if w.Provider == "" {
		return nil
	}
	return &proxy.Webhook{Provider: w.Provider, Secrets: slices.Clone(secrets), Tolerance: w.Tolerance, Events: slices.Clone(w.Events)}
}

// grpcCodes are names' gRPC status codes (validated names).
func grpcCodes(names []string) []int {
	out := make([]int, 0, len(names))
	for _, n := range names {
		out = append(out, config.GRPCCodes[n])
	}
	return out
}
