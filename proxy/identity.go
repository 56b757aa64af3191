package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
)

var (
	errIdentityAmbiguous = errors.New("the identity header appears more than once")
	errIdentitySpelling  = errors.New("the identity header appears under another spelling")
)

// identity decides whose request this is, in two steps. admit runs for
// every request, first: it decides once whether the peer is trusted and
// strips what an untrusted peer may not assert (the identity header and
// X-Forwarded-Client-Cert under every spelling a CGI-style upstream would
// read as the same header, and the strip list), so neither idemproxy nor
// the upstream ever sees a forged identity; and it refuses a trusted
// peer's identity header sent twice or under another spelling, since
// idemproxy and the upstream could read different principals. Then a
// protected request asks the source for its principal.
type identity struct {
	// header is the identity header's canonical name; read is the header
	// the source reads (header, or XFCC), checked for spellings and
	// duplicates from trusted peers.
	header, read string
	trusted      []netip.Prefix
	// untrustedHeaders are removed, under every spelling, from untrusted
	// peers' requests: the identity header, XFCC and the strip list.
	untrustedHeaders nameSet
	// src reads the principal of a protected request.
	src source
	// replace is set when the principal comes from something else than
	// the identity header (xfcc, jwt): the header is then removed from
	// every request, under every spelling, and a protected request carries
	// the principal idemproxy used in it, so that the upstream never reads
	// another one next to a key scoped to this one.
	replace bool
}

// source is where principals come from: one per identity.source. Adding
// one is a type here and a case in newIdentity.
type source interface {
	// principal returns the principal of r, a protected request already
	// admitted; "" when it names none. trusted says whether the peer is
	// a trusted proxy.
	principal(ctx context.Context, r *http.Request, trusted bool) (string, error)
	// missing is what a request without a principal is told to send.
	missing() string
}

func newIdentity(cfg Identity, client *http.Client) identity {
	id := identity{header: http.CanonicalHeaderKey(cfg.Header), trusted: cfg.TrustedProxies}
	id.untrustedHeaders = nameSet{id.header, xFCCHeader}
	for _, h := range cfg.StripFromUntrusted {
		if !id.untrustedHeaders.has(h) {
			id.untrustedHeaders = append(id.untrustedHeaders, h)
		}
	}
	id.read = id.header
	switch cfg.Source {
	case SourceXFCC:
		id.src, id.read, id.replace = xfccSource{}, xFCCHeader, true
	case SourceJWT:
		id.src, id.replace = newJWTSource(cfg.JWT, client), true
	default:
		id.src = headerSource{header: id.header}
	}
	return id
}

// admit decides whether r's peer is trusted and strips what an untrusted
// peer may not assert. From a trusted peer, the header the source reads
// (the identity header, or XFCC) sent twice or under another spelling is
// an error. It must run before anything reads the request's headers.
func (id *identity) admit(r *http.Request) (trusted bool, err error) {
	trusted = id.isTrusted(r.RemoteAddr)
	read := id.read
	for name, vs := range r.Header {
		switch {
		case !trusted && id.untrustedHeaders.has(name):
			delete(r.Header, name)
		case id.replace && sameName(name, id.header):
			delete(r.Header, name) // a protected request gets the principal used (exchange.admit)
		case trusted && sameName(name, read) && name != read:
			err = errIdentitySpelling
		case trusted && name == read && len(vs) > 1:
			err = errIdentityAmbiguous
		}
	}
	return trusted, err
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

// headerSource: the identity header's value is the principal, from a
// trusted peer (admit stripped it from anyone else).
type headerSource struct{ header string }

func (s headerSource) principal(_ context.Context, r *http.Request, _ bool) (string, error) {
	return r.Header.Get(s.header), nil
}

func (s headerSource) missing() string { return "an authenticated principal in " + s.header }

// xfccSource: the URI SAN of the peer's client certificate, as the mesh
// proxy in the pod hands it in X-Forwarded-Client-Cert.
type xfccSource struct{}

func (xfccSource) principal(_ context.Context, r *http.Request, _ bool) (string, error) {
	v := r.Header.Get(xFCCHeader)
	if v == "" {
		return "", nil
	}
	return xfccPrincipal(v)
}

func (xfccSource) missing() string {
	return "a mesh identity (" + xFCCHeader + " with a URI SAN) from the proxy in the pod"
}
