package proxy

import "net/netip"

var trustedLoopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// For the external tests.
var (
	TestRoute  = testRoute
	TestConfig = testConfig
)
