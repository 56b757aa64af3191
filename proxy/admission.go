package proxy

import (
	"errors"
	"strconv"
	"strings"
)

// Admission: what must hold before a protected request's body is read or
// its key claimed (the path as matched, no hop-by-hop nomination of what
// the proxy relies on, one key under one spelling, a principal), and the
// key taken from a JSON body (key_json_pointer). Each refusal is decided
// here, as a problem+json reply, and nothing is claimed or forwarded. Webhook
// routes admit by signature instead (webhook.go); the bounds on what is
// held once admitted are in limits.go.

// admit checks what must hold before anything is read or claimed: the
// path as matched, no hop-by-hop nomination of what the proxy relies on,
// the key under one spelling, and a principal, who holds the request's
// bytes from then on (x.bufs.holder). It returns the unquoted key, now also in
// the forwarded header; or the reply that refused it (or forwards it
// unprotected, on an optional route).
func (x *exchange) admit() (key string, rep *reply) {
	s := &x.rt.settings
	// The upstream must get the request that was matched and fingerprinted:
	// a path with dot segments, repeated or trailing slashes (or their
	// percent-encoded forms) could be protected as one route and acted on
	// as another.
	if x.r.URL.Path != x.path {
		return "", refuse(outcomeRejected, probPathNotCanonical.with("send it to "+x.path+", the path this route protects"))
	}
	if rep := x.keyHeaderAdmitted(); rep != nil {
		return "", rep
	}
	key, keyErr := parseKey(x.r.Header, s.KeyHeader)
	fromBody := x.rt.keyPointer != nil || x.rt.grpc && s.GRPCKeyField > 0
	if errors.Is(keyErr, errKeyMissing) && !s.RequireKey && !fromBody {
		return "", bypassWith(nil, "no idempotency key on an optional route")
	}
	// Asked here, not for every request: only a protected request needs
	// a principal, and a signature check costs real CPU.
	p, err := x.h.id.src.principal(x.r.Context(), x.r, x.trusted)
	switch {
	case errors.Is(err, errTokenTwice), errors.Is(err, errXFCC):
		return "", refuse(outcomeRejected, probIdentityInvalid.with(err.Error()))
	case err != nil && !errors.Is(err, errNoToken):
		return "", refuse(outcomeRejected, probTokenInvalid.with("the bearer token is not valid: "+err.Error()))
	}
	if strings.HasPrefix(p, webhookPrincipals) {
		return "", refuse(outcomeRejected, probIdentityInvalid.with("principals under "+webhookPrincipals+" are the webhook routes' providers and their senders; no identity source may assert one"))
	}
	x.bufs.holder = p
	if x.h.id.replace && p != "" {
		x.r.Header.Set(x.h.id.header, p) // what the key is scoped to is what the upstream reads
	}
	switch {
	case p == "":
		return "", refuse(outcomeRejected, probIdentityMissing.with("this route needs "+x.h.id.src.missing()))
	case errors.Is(keyErr, errKeyMissing) && fromBody:
		return "", nil // looked for in the body once it is read
	case errors.Is(keyErr, errKeyMissing):
		return "", refuse(outcomeRejected, probKeyMissing.with("send an "+s.KeyHeader+" header"))
	case keyErr != nil:
		return "", refuse(outcomeRejected, probKeyMalformed.with(keyErr.Error()))
	}
	// Forward the unquoted key: the upstream can dedupe on it in its own
	// transaction, closing the dual-write window from its side.
	x.r.Header.Set(s.KeyHeader, key)
	return key, nil
}

// keyHeaderAdmitted refuses a request that nominates the key header as
// hop-by-hop (ReverseProxy would strip it after idemproxy read it) or
// sends it under another spelling (the upstream could read another key):
// the reply that refused it, nil when admitted. The other hop-by-hop
// nominations were checked for every request.
func (x *exchange) keyHeaderAdmitted() *reply {
	if tok := nominated(x.r.Header, x.rt.keyNames); tok != "" {
		return refuse(outcomeRejected, probHopByHop.with("Connection nominates "+tok+", which idemproxy and the upstream rely on"))
	}
	for name := range x.r.Header {
		if sameName(name, x.rt.settings.KeyHeader) && name != x.rt.keyHeader {
			return refuse(outcomeRejected, probKeyMalformed.with("the idempotency key is sent as "+name+"; send it only as "+x.rt.keyHeader))
		}
	}
	return nil
}

// keyInBody applies key_json_pointer (or, on a grpc route,
// grpc.key_field) once the body is read: without the header the key is
// read from read (the body, or the call's message) and forwarded in the
// header; with both they must agree. Or the reply: refused, or body
// forwarded unprotected on an optional route without a key.
func (x *exchange) keyInBody(header string, body, read []byte) (string, *reply) {
	s := &x.rt.settings
	var key string
	var found bool
	var err error
	if x.rt.grpc {
		key, found, err = protoStringField(read, s.GRPCKeyField)
		if err == nil && found {
			key, err = checkKey(key)
		}
	} else {
		key, found, err = bodyKey(read, x.rt.keyPointer)
	}
	switch {
	case err != nil:
		return "", refuse(outcomeRejected, probKeyMalformed.with(x.rt.keyInBodyName()+": "+err.Error()))
	case header != "" && found && key != header:
		return "", refuse(outcomeRejected, probKeyMalformed.with("the "+s.KeyHeader+" header and "+x.rt.keyInBodyName()+" name different keys"))
	case header != "":
		return header, nil
	case !found && !s.RequireKey:
		return "", bypassWith(body, "no idempotency key, in the header or the body, on an optional route")
	case !found:
		return "", refuse(outcomeRejected, probKeyMissing.with("send an "+s.KeyHeader+" header, or "+x.rt.keyInBodyName()))
	}
	x.r.Header.Set(s.KeyHeader, key) // the upstream gets it as if the client had sent it
	return key, nil
}

// keyInBodyName is where keyInBody looks on rt, as a refusal names it.
func (rt *route) keyInBodyName() string {
	if rt.grpc {
		return "field " + strconv.Itoa(rt.settings.GRPCKeyField) + " of the request message (grpc.key_field)"
	}
	return rt.settings.KeyJSONPointer
}

// webhookPrincipals prefixes the principals of webhook routes: the
// providers, and the peers whose deliveries are not verified yet. No
// identity source may assert one.
const webhookPrincipals = "webhook:"

// grpcCall is the request message of a call on a grpc route, or the
// reply that refuses it before anything is claimed: not gRPC, more than
// one message, or one idemproxy cannot decompress.
func (x *exchange) grpcCall(body []byte) ([]byte, *reply) {
	if !isGRPC(x.r.Header.Get("Content-Type")) {
		return nil, refuse(outcomeRejected, probCallInvalid.with("a protocol: grpc route takes gRPC calls (content-type application/grpc)"))
	}
	msg, err := grpcMessage(body, x.r.Header.Get("Grpc-Encoding"), x.rt.settings.MaxRequestBody)
	if err != nil {
		return nil, refuse(outcomeRejected, probCallInvalid.with(err.Error()))
	}
	return msg, nil
}
