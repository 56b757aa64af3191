package proxy

import (
	"net/url"
	"time"
)

// testRoute is a route with the settings config's defaults give one.
func testRoute(name, pattern string) Route {
	return Route{
		Name:               name,
		Pattern:            pattern,
		KeyHeader:          "Idempotency-Key",
		RequireKey:         true,
		Retention:          24 * time.Hour,
		Lease:              10 * time.Second,
		MaxWait:            5 * time.Second,
		ReleaseOn:          []int{429, 503},
		MaxRequestBody:     1 << 20,
		MaxResponseBody:    1 << 20,
		FingerprintHeaders: []string{"Content-Type"},
		AuthorizeTimeout:   time.Second,
		ExcludeHeaders:     []string{"Set-Cookie"},
	}
}

// testConfig is a Config for upstream, with config's defaults and no
// routes.
func testConfig(upstream string) Config {
	u, err := url.Parse(upstream)
	if err != nil {
		panic(err)
	}
	return Config{
		Upstream:            u,
		UpstreamTimeout:     30 * time.Second,
		LateAnswerWindow:    5 * time.Minute,
		MaxLateCalls:        1000,
		PassThroughUpgrades: []string{"websocket"},
		Identity: Identity{
			Header:         "X-Forwarded-User",
			TrustedProxies: trustedLoopback,
			StripFromUntrusted: []string{"X-Real-Ip", "X-Client-Ip", "True-Client-Ip", "X-Forwarded-Host",
				"X-Forwarded-Proto", "X-Forwarded-Client-Cert", "X-Original-Forwarded-For"},
		},
	}
}
