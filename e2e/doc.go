// Package e2e holds the binary's own tests: this tree's idemproxy built
// once (internal/binarytest), started on free loopback ports against real
// redis-servers and httptest upstreams, and driven as a client and an
// operator would, from startup failures and reloads to killed owners,
// stepped clocks and late replies. It has no code of its own; the
// repository's root package keeps its unit tests, which run the server in
// process.
package e2e
