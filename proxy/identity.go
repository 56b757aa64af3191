package proxy

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
)

var (
	errIdentityAmbiguous = errors.New("the identity header appears more than once")
	errIdentitySpelling  = errors.New("the identity header appears under another spelling")
)

// identity decides whose request this is. The identity header is honoured
// only from a trusted peer (the auth proxy or mesh in the pod); from anyone
// else it is deleted from the request under every spelling a CGI-style
// upstream would read as the same header, so neither idemproxy nor the
// upstream ever sees a forged principal.
type identity struct {
	// header is the identity header's canonical name.
	header string
	// xfcc reads the principal from header as an XFCC value.
	xfcc    bool
	trusted []netip.Prefix
	// strip are trust-bearing headers (X-Real-Ip, ...) removed, under
	// every spelling, from untrusted peers' requests.
	strip nameSet
}

func newIdentity(cfg Config) identity {
	id := identity{header: http.CanonicalHeaderKey(cfg.IdentityHeader), trusted: cfg.TrustedProxies, xfcc: cfg.IdentityFromXFCC}
	if id.xfcc {
		id.header = XFCCHeader
	}
	for _, h := range cfg.StripFromUntrusted {
		if !sameName(h, id.header) { // the identity header has rules of its own
			id.strip = append(id.strip, h)
		}
	}
	return id
}

// principal returns the caller's principal, "" when there is none, after
// stripping the identity header and the strip list from an untrusted
// peer's request, and whether the peer is trusted. From a trusted peer,
// the identity header sent twice or under another spelling is an error:
// idemproxy and the upstream could read different principals. It must run
// before anything reads the request's headers.
func (id *identity) principal(r *http.Request) (principal string, trusted bool, err error) {
	trusted = id.isTrusted(r.RemoteAddr)
	for name, vs := range r.Header {
		switch {
		case sameName(name, id.header):
			switch {
			case !trusted:
				delete(r.Header, name)
			case name != id.header:
				err = errIdentitySpelling
			case len(vs) > 1:
				err = errIdentityAmbiguous
			case id.xfcc:
				principal, err = xfccPrincipal(vs[0])
			default:
				principal = vs[0]
			}
		case !trusted && id.strip.has(name):
			delete(r.Header, name)
		}
	}
	if err != nil {
		return "", trusted, err
	}
	return principal, trusted, nil
}

func (id *identity) isTrusted(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	addr = addr.Unmap().WithZone("")
	for _, p := range id.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
