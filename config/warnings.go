package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Warnings are settings that are valid but dangerous enough to say so at
// every start: each names its key.
func (c *Config) Warnings() []string {
	var w []string
	for _, name := range c.strayEnv {
		w = append(w, fmt.Sprintf("%s: set, but it names no config key (a typo leaves the default in force); the overrides are %s_ and a key's path in capitals, dots as underscores (IDEMPROXY_STORE_REDIS_PASSWORD)", name, EnvPrefix))
	}
	if len(c.Routes) == 0 {
		w = append(w, "routes: none: every request is forwarded unprotected; list the endpoints to protect under routes:")
	}
	w = append(w, c.trustWarnings()...)
	if len(c.Store.Encryption.KeyFiles) > 1 && c.Store.KeySecretFile == "" {
		w = append(w, "store.encryption.key_files: several keys and no store.key_secret_file: Redis keys are derived from the first key file, so prepending a key moves every key; records stored before are no longer found and their retries execute again; set store.key_secret_file before rotating")
	}
	switch {
	case c.Store.Compression == CompressionZstd && c.Store.RecordFormat < 3:
		w = append(w, "store.compression: zstd is written only under store.record_format: 3 (releases before v0.5.0 cannot read compressed records): set 3 once every replica runs v0.5.0 or later")
	case c.Store.KeySecretFile != "" && c.Store.RecordFormat < 2:
		w = append(w, "store.record_format: 1: fingerprints are stored as plain SHA-256, which someone who reads Redis can check guessed request bodies against; set 2 (keyed with store.key_secret_file) once every replica runs v0.4.0 or later (CHANGELOG.md)")
	}
	w = append(w, c.streamWarnings()...)
	w = append(w, c.postgresWarnings()...)
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
	w = append(w, c.webhookWarnings()...)
	w = append(w, c.quotaWarnings()...)
	if len(c.Store.Redis.Addrs) == 0 && c.Store.Postgres.URL == "" {
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

// trustWarnings are what identity.trusted_proxies lets every peer do.
func (c *Config) trustWarnings() []string {
	var w []string
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
	return w
}

// streamWarnings are routes whose stream: auto waits for record_format 4,
// and on PostgreSQL, under 4, the routes whose streams rewrite their whole
// value on every append: every stream: auto route, written or inherited
// (one warning naming them).
func (c *Config) streamWarnings() []string {
	var w, square []string
	for i, r := range c.Routes {
		if r.Stream == StreamAuto && r.Webhook.Provider == "" {
			square = append(square, r.Name)
		}
		if r.Stream == StreamAuto && r.set != nil && r.set["stream"] && c.Store.RecordFormat < 4 {
			w = append(w, fmt.Sprintf("routes[%d].stream: auto: streamed answers (text/event-stream, application/x-ndjson) are buffered whole until store.record_format: 4, which releases before v0.6.0 cannot read: set it once every replica runs v0.6.0", i))
		}
	}
	if c.Store.RecordFormat == 4 && c.Store.Postgres.URL != "" && len(square) > 0 {
		w = append(w, fmt.Sprintf("store.record_format: 4 on PostgreSQL: every append to a streamed answer (routes %s) rewrites its whole value, so its WAL grows with the square of its length (a 1 MiB stream writes about 565 MiB); set 5 (its chunks as rows) once every replica runs v0.8.0 or later", strings.Join(square, ", ")))
	}
	return w
}

// webhookWarnings are webhook routes' settings that do not apply, or
// that a default they do not inherit would have set.
func (c *Config) webhookWarnings() []string {
	var w []string
	for i, r := range c.Routes {
		if r.Webhook.Provider == "" || r.set == nil {
			continue
		}
		if !r.set["quota.new_keys"] && c.Defaults.Quota.NewKeys > 0 {
			w = append(w, fmt.Sprintf("routes[%d].quota.new_keys: not set, so defaults.quota.new_keys (%d) does not apply to this webhook route (%s): every delivery is the provider's, and a busy provider would be refused 429 too-many-keys past %d events a window; set it on the route to bound the provider's new keys", i, c.Defaults.Quota.NewKeys, r.Name, c.Defaults.Quota.NewKeys))
		}
		if WebhookEventGrammar[r.Webhook.Provider] != nil && len(r.Webhook.Events) == 0 {
			w = append(w, fmt.Sprintf("routes[%d].webhook.events: not set, so this %s route (%s) accepts every well-formed event: the event is not signed, and a captured delivery can be resent once under each event name; list the events the app handles", i, r.Webhook.Provider, r.Name))
		}
		if r.set["scope"] && r.Settings.Scope == ScopePrincipal {
			w = append(w, fmt.Sprintf("routes[%d].scope: principal is not applied to a webhook route (%s): its deliveries are always scoped by route; records v0.5.0 stored under the shared scope are still read for one retention", i, r.Name))
		}
	}
	return w
}

// quotaWarnings is one warning for an unset defaults.quota.new_keys,
// naming the routes it leaves unbounded (it said the same once per
// route).
func (c *Config) quotaWarnings() []string {
	var w []string
	if c.Defaults.Quota.NewKeys == 0 {
		var unbounded []string
		for _, r := range c.Routes {
			if r.Settings.Quota.NewKeys == 0 && r.Webhook.Provider == "" {
				unbounded = append(unbounded, r.Name)
			}
		}
		if len(unbounded) > 0 {
			w = append(w, fmt.Sprintf("defaults.quota.new_keys: 0 (routes without one of their own: %s): one principal can claim new keys without bound and fill the store for the whole retention (503 store-full for everyone); set defaults.quota.new_keys (docs/security.md, Trust rules, sizes it)", strings.Join(unbounded, ", ")))
		}
	}
	return w
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

// postgresWarnings: a PostgreSQL URL whose sslmode lets the driver fall
// back to plaintext (disable, allow, prefer: the driver's default) off
// loopback, where the records (answers, fingerprints) and the password
// cross a network, or encrypts without checking the server (require); a
// Redis-only setting given with PostgreSQL.
func (c *Config) postgresWarnings() []string {
	var w []string
	if c.Store.Postgres.URL != "" && c.Store.ClaimMemoryLimit != DefaultClaimMemoryLimit {
		w = append(w, fmt.Sprintf("store.claim_memory_limit: %g%% does nothing with store.postgres: it is a share of Redis' maxmemory; PostgreSQL's disk is the database's to watch (idemproxy_store_used_bytes); remove it", c.Store.ClaimMemoryLimit*100))
	}
	for _, k := range []struct{ path, raw string }{{"store.postgres.url", c.Store.Postgres.URL}, {"store.postgres.listen_url", c.Store.Postgres.ListenURL}} {
		if k.raw == "" {
			continue
		}
		cfg, err := parsePostgres(k.raw)
		if err != nil {
			continue // an error of its own
		}
		hosts := []string{cfg.Host}
		for _, fb := range cfg.Fallbacks {
			hosts = append(hosts, fb.Host)
		}
		plain := cfg.TLSConfig == nil
		for _, fb := range cfg.Fallbacks {
			plain = plain || fb.TLSConfig == nil
		}
		unverified := false
		for _, tc := range append([]*tls.Config{cfg.TLSConfig}, fallbackTLS(cfg)...) {
			// sslmode=require: encrypted, with no check of the server's
			// certificate (verify-ca and verify-full check it).
			unverified = unverified || tc != nil && tc.InsecureSkipVerify && tc.VerifyPeerCertificate == nil
		}
		switch {
		case allLoopback(hosts):
		case plain:
			w = append(w, fmt.Sprintf("%s: its sslmode lets the connection be plaintext (disable, allow, or prefer, the driver's default when unset) to a host off loopback: records and the password cross the network in clear; set sslmode=verify-full (and sslrootcert)", k.path))
		case unverified:
			w = append(w, fmt.Sprintf("%s: sslmode=require encrypts the connection but checks nothing of the server's certificate: whoever is on the path can pose as the database and read the records and the password; set sslmode=verify-full (and sslrootcert)", k.path))
		}
	}
	return w
}

// fallbackTLS is the TLS configuration of each of cfg's fallbacks.
func fallbackTLS(cfg *pgconn.Config) []*tls.Config {
	out := make([]*tls.Config, len(cfg.Fallbacks))
	for i, fb := range cfg.Fallbacks {
		out[i] = fb.TLSConfig
	}
	return out
}

// allLoopback reports whether every host is this machine: a loopback
// address, localhost, or a Unix socket directory.
func allLoopback(hosts []string) bool {
	for _, h := range hosts {
		if strings.HasPrefix(h, "/") || h == "localhost" {
			continue
		}
		if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}
