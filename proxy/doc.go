// Package proxy owns idemproxy's request path: route matching, identity,
// idempotency keys, fingerprints, and the claim-forward-store protocol in
// front of the upstream.
//
// It is not a library. Its exported names serve the idemproxy binary
// (the repository's main package) and the repository's own tests and
// harnesses (bench, chaos, fleet, compat); they change between releases
// without notice, and zero values are not meant to be usable (a Handler
// comes from New). What idemproxy promises to keep is its behaviour over
// HTTP, its configuration keys, its metrics and the formats it stores
// (CHANGELOG.md, "Compatibility rule"), not a Go API. A program that
// wants idempotent retries runs the sidecar.
//
// The package has two halves. The protocol (protocol.go down to the
// claim's settlement) runs on one key and knows no HTTP request: a front
// hands it who presents which key, and how its call went. The HTTP front
// (Handler, the exchange, the owner) admits requests, forwards them
// through httputil.ReverseProxy and writes answers. Each route's framer
// (problem.go) is the seam between them: every answer idemproxy makes,
// refusals and the outcome-unknown record it stores, is framed by the
// route's front.
//
// Reading order, following one protected request:
//
//   - serve.go: New builds a Handler (handler.go: the HTTP front) and the
//     protocol it shares with every attempt (protocol.go) from a Config
//     (config.go); ServeHTTP matches the route (route.go) and hands
//     protected requests to an exchange, everything else to the
//     pass-through proxy (forward.go, upgrade.go, transport.go).
//   - admission: admission.go reads the identity (identity.go, xfcc.go,
//     jwt.go) and the key (key.go, bodykey.go in a JSON body), and
//     firstsent.go the time a request was first sent; a webhook route
//     admits a signed delivery instead (webhook.go, providers.go). The
//     body is read into pooled buffers (pool.go) within the bounds of
//     limits.go, and fingerprinted (fingerprint.go, headers.go).
//   - exchange.go: what one protected request holds, its body, its spans
//     (trace.go) and its result, noted in one place. Each step returns
//     the reply it decided (reply.go: a problem, a stored answer, or an
//     unprotected forward); respond.go alone writes it, within
//     client.write_timeout (clientwrite.go), marked for Repeatable
//     Requests clients (repeatability.go); finish counts and logs the
//     request once (metrics.go, logline.go).
//   - front.go and attempt.go: the protocol on one key, built whole from
//     the request's front once it is admitted: the claim, own-or-answer,
//     waiting, what an existing record answers (replay, 409, 422,
//     attaching to a stream), settling an orphan; every store call goes
//     through storecall.go (timed, traced, retried). What this sidecar
//     saw of other owners' claims, to judge them gone on its own clock,
//     is liveness.go; claims whose reply never came are cleaned up by
//     unconfirmed.go.
//   - settle.go and fail.go: the claim an attempt holds, from its claim
//     to its settlement: renewals (keepAlive), complete, release, keep,
//     and fail, which applies unknown_outcome and reconcile, each settling
//     once. reconcile.go asks the upstream about a key whose outcome is
//     unknown (lookup.go: the lookup), takes it over from a vanished owner
//     and settles or frees it by the answer; reconcilekey.go is the key
//     API's reconcile-now, an attempt with no request at all.
//   - owner.go and answer.go: the HTTP front's owner forwards through a
//     gate (gate.go) that holds the answer until it is stored, answers
//     504 at upstream.timeout while a late call goes on, and its
//     ReverseProxy hooks tell the holding what the call brought: the
//     upstream's answer, stored before the client gets it, or a failure;
//     authorize.go re-checks a replay.
//   - streams (stream.go): a streamed answer's pump (pump.go) stores each
//     chunk before anyone reads it, coalescing reads on a flush interval
//     (coalesce.go); retries follow it from the store (follow.go), sharing
//     one read per running stream on this sidecar (fanout.go), and resume
//     after a Last-Event-ID (resume.go).
//   - problem.go: every problem idemproxy answers with, and the framers
//     that frame them for a route's front; grpc.go, the gRPC and Connect
//     fronts' framers, the unary call's message (fingerprinted instead of
//     the body, its key field read from the wire) and its trailers,
//     stored with the answer.
//   - doc.go: this reading order, which names every file (TestDocNamesEveryFile).
package proxy
