package proxy

import "net/netip"

var trustedLoopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// For the external tests.
var (
	TestRoute  = testRoute
	TestConfig = testConfig
)

// Waiting is how many retries wait for a first attempt now.
func (h *Handler) Waiting() int { return int(h.waiting.Load()) }
