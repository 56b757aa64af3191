package proxy

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
)

var errIdentityAmbiguous = errors.New("the identity header appears more than once")

// identity decides whose request this is. The identity header is honoured
// only from a trusted peer (the auth proxy or mesh in the pod); from anyone
// else it is deleted from the request, so neither idemproxy nor the upstream
// ever sees a forged principal.
type identity struct {
	header  string
	trusted []netip.Prefix
}

// principal returns the caller's principal, "" when there is none, after
// stripping the header from an untrusted peer's request, and whether the
// peer is trusted. It must run before anything reads the request's headers.
func (id *identity) principal(r *http.Request) (principal string, trusted bool, err error) {
	if !id.isTrusted(r.RemoteAddr) {
		r.Header.Del(id.header)
		return "", false, nil
	}
	vs := r.Header.Values(id.header)
	switch len(vs) {
	case 0:
		return "", true, nil
	case 1:
		return vs[0], true, nil
	default:
		return "", true, errIdentityAmbiguous
	}
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
