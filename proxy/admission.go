package proxy

import (
	"errors"
	"strings"
)

// Admission: what must hold before a protected request's body is read or
// its key claimed (the path as matched, no hop-by-hop nomination of what
// the proxy relies on, one key under one spelling, a principal), and the
// key taken from a JSON body (key_json_pointer). Each refusal is answered
// here, as problem+json, and nothing is claimed or forwarded. Webhook
// routes admit by signature instead (webhook.go); the bounds on what is
// held once admitted are in limits.go.

// admit checks what must hold before anything is read or claimed: the
// path as matched, no hop-by-hop nomination of what the proxy relies on,
// the key under one spelling, and a principal. It returns the unquoted
// key, now also in the forwarded header; false when the request was
// answered (refused, or forwarded unprotected on an optional route).
func (x *exchange) admit() (key string, ok bool) {
	s := &x.rt.settings
	// The upstream must get the request that was matched and fingerprinted:
	// a path with dot segments, repeated or trailing slashes (or their
	// percent-encoded forms) could be protected as one route and acted on
	// as another.
	if x.r.URL.Path != x.path {
		x.answer(outcomeRejected, probPathNotCanonical.with("send it to "+x.path+", the path this route protects"))
		return "", false
	}
	if !x.keyHeaderAdmitted() {
		return "", false
	}
	key, keyErr := parseKey(x.r.Header, s.KeyHeader)
	fromBody := x.rt.keyPointer != nil
	if errors.Is(keyErr, errKeyMissing) && !s.RequireKey && !fromBody {
		x.bypass(nil, "no idempotency key on an optional route")
		return "", false
	}
	// Asked here, not for every request: only a protected request needs
	// a principal, and a signature check costs real CPU.
	p, err := x.h.id.src.principal(x.r.Context(), x.r, x.trusted)
	switch {
	case errors.Is(err, errTokenTwice), errors.Is(err, errXFCC):
		x.answer(outcomeRejected, probIdentityInvalid.with(err.Error()))
		return "", false
	case err != nil && !errors.Is(err, errNoToken):
		x.answer(outcomeRejected, probTokenInvalid.with("the bearer token is not valid: "+err.Error()))
		return "", false
	}
	if strings.HasPrefix(p, webhookPrincipals) {
		x.answer(outcomeRejected, probIdentityInvalid.with("principals under "+webhookPrincipals+" are the webhook routes' providers and their senders; no identity source may assert one"))
		return "", false
	}
	x.principal = p
	if x.h.id.replace && p != "" {
		x.r.Header.Set(x.h.id.header, p) // what the key is scoped to is what the upstream reads
	}
	switch {
	case x.principal == "":
		x.answer(outcomeRejected, probIdentityMissing.with("this route needs "+x.h.id.src.missing()))
		return "", false
	case errors.Is(keyErr, errKeyMissing) && fromBody:
		return "", true // looked for in the body once it is read
	case errors.Is(keyErr, errKeyMissing):
		x.answer(outcomeRejected, probKeyMissing.with("send an "+s.KeyHeader+" header"))
		return "", false
	case keyErr != nil:
		x.answer(outcomeRejected, probKeyMalformed.with(keyErr.Error()))
		return "", false
	}
	// Forward the unquoted key: the upstream can dedupe on it in its own
	// transaction, closing the dual-write window from its side.
	x.r.Header.Set(s.KeyHeader, key)
	return key, true
}

// keyHeaderAdmitted refuses a request that nominates the key header as
// hop-by-hop (ReverseProxy would strip it after idemproxy read it) or
// sends it under another spelling (the upstream could read another key):
// false when it answered. The other hop-by-hop nominations were checked
// for every request.
func (x *exchange) keyHeaderAdmitted() bool {
	if tok := nominated(x.r.Header, x.rt.keyNames); tok != "" {
		x.answer(outcomeRejected, probHopByHop.with("Connection nominates "+tok+", which idemproxy and the upstream rely on"))
		return false
	}
	for name := range x.r.Header {
		if sameName(name, x.rt.settings.KeyHeader) && name != x.rt.keyHeader {
			x.answer(outcomeRejected, probKeyMalformed.with("the idempotency key is sent as "+name+"; send it only as "+x.rt.keyHeader))
			return false
		}
	}
	return true
}

// keyInBody applies key_json_pointer once the body is read: without the
// header the key is the body's (and is forwarded in the header); with
// both they must agree. It reports false when it answered: refused, or
// forwarded unprotected on an optional route without a key.
func (x *exchange) keyInBody(header string, body []byte) (string, bool) {
	s := &x.rt.settings
	key, found, err := bodyKey(body, x.rt.keyPointer)
	switch {
	case err != nil:
		x.answer(outcomeRejected, probKeyMalformed.with(s.KeyJSONPointer+": "+err.Error()))
		return "", false
	case header != "" && found && key != header:
		x.answer(outcomeRejected, probKeyMalformed.with("the "+s.KeyHeader+" header and "+s.KeyJSONPointer+" in the body name different keys"))
		return "", false
	case header != "":
		return header, true
	case !found && !s.RequireKey:
		x.bypass(body, "no idempotency key, in the header or the body, on an optional route")
		return "", false
	case !found:
		x.answer(outcomeRejected, probKeyMissing.with("send an "+s.KeyHeader+" header, or "+s.KeyJSONPointer+" in a JSON body"))
		return "", false
	}
	x.r.Header.Set(s.KeyHeader, key) // the upstream gets it as if the client had sent it
	return key, true
}
