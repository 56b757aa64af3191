package proxy

import (
	"context"
	"net/http"
	"net/netip"
)

var trustedLoopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// For the external tests.
var (
	TestRoute     = testRoute
	TestConfig    = testConfig
	EmbeddedStore = embeddedStore
)

// principal is admit then the source, for the tests of identity alone.
func (id *identity) principal(r *http.Request) (principal string, trusted bool, err error) {
	trusted, err = id.admit(r)
	if err != nil {
		return "", trusted, err
	}
	principal, err = id.src.principal(context.Background(), r, trusted)
	return principal, trusted, err
}
