// Package proxy owns idemproxy's HTTP request path: route matching,
// identity, idempotency keys, fingerprints, and the claim-forward-store
// sequence in front of the upstream.
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
// Reading order, following one protected request:
//
//   - serve.go: New builds a Handler (handler.go: what every request
//     shares) from a Config (config.go); ServeHTTP matches the route
//     (route.go) and hands protected requests to an exchange, everything
//     else to the pass-through proxy (forward.go, upgrade.go,
//     transport.go). The exchange serves: admission.go (identity.go,
//     xfcc.go, jwt.go, webhook.go with providers.go; key.go, bodykey.go;
//     firstsent.go), the body (pool.go, within limits.go), the
//     fingerprint (fingerprint.go, headers.go); then it runs its attempt,
//     and finish counts and logs the request once (metrics.go,
//     logline.go).
//   - exchange.go: what one protected request holds, its body and its
//     spans. Each step returns the reply it decided (reply.go: a
//     problem, a stored answer, or an unprotected forward) and respond.go
//     alone writes it.
//   - front.go and attempt.go: the protocol on one key, with no HTTP
//     request, built whole from the request's front once it is admitted:
//     the claim, own-or-answer, waiting, what an existing record answers
//     (replay, 409, 422, attaching to a stream), settling an orphan, and
//     reconcile.go's take-over and lookup; every store call goes through
//     storecall.go (timed, traced, retried). The key API's reconcile-now
//     runs an attempt directly (Handler.ReconcileKey).
//   - owner.go: the claim's owner forwards through a gate (gate.go) that
//     holds the answer until it is stored, renews the lease, and answers
//     504 at upstream.timeout while a late call goes on; answer.go stores
//     the upstream's answer before the client gets it, or settles a
//     failure; settle.go holds the claim (release, keep or complete) and
//     bounds the dual-write window; authorize.go re-checks a replay.
//   - unconfirmed.go: claims whose reply never came, cleaned up in the
//     background; limits.go: the three bounds on what principals hold
//     (buffered bytes, calls forwarding, late calls), one shape.
//   - problem.go: every answer idemproxy writes itself, as problem+json;
//     trace.go: spans and trace context.
package proxy
