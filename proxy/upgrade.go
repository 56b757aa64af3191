package proxy

import (
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// Protocol upgrades. A 101 turns the connection into a tunnel idemproxy
// no longer reads: a protected request must never hold a claim across one
// (its outcome could never be stored), so every Upgrade on a protected
// route is refused; on unprotected paths only the protocols listed in
// Config.PassThroughUpgrades (WebSocket by default: legacy apps have
// them) are forwarded, since an upstream that goes on parsing HTTP inside
// a tunnel (h2c) would read headers nobody stripped.

// upgradeType is the protocol a request asks to switch to, as
// httputil.ReverseProxy reads it; "" when it asks for none.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}
