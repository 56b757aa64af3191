package config

import (
	"fmt"
	"net/netip"
	"time"
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
