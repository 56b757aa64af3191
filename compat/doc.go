// Package compat drives retrying client libraries people already use
// (stripe-go, hashicorp/go-retryablehttp; stripe-node, the openai npm
// package streaming chat completions, and Python requests through the
// drivers in node/ and python/) through the real idemproxy
// binary against a recording upstream, and checks what each library hands
// its application and how often the upstream executed. It is its own
// module, so that idemproxy's go.mod does not carry the clients; .ci/run
// runs it. The README's Clients table is measured here.
package compat
