package proxy

import (
	"net/netip"
	"net/url"
	"time"

	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

// Config is what a Handler serves: the upstream, where principals come
// from, and the protected routes. The main package builds it from the
// validated YAML config; every field is taken as given.
type Config struct {
	// Upstream is where every request is sent.
	Upstream *url.URL
	// UpstreamTimeout is how long a client waits for the upstream's answer.
	UpstreamTimeout time.Duration
	// BodyReadTimeout bounds reading a protected request's body, and how
	// long a pass-through body may pause. Zero uses defaultBodyReadTimeout.
	BodyReadTimeout time.Duration
	// WriteTimeout cuts a client that takes nothing of an answer idemproxy
	// writes (a replay, a stream) for this long; SetWriteTimeout changes
	// it. Zero uses defaultWriteTimeout.
	WriteTimeout time.Duration
	// LateAnswerWindow is how much longer than UpstreamTimeout an owner
	// keeps the upstream call open to store its late answer. Zero cancels
	// the call at UpstreamTimeout.
	LateAnswerWindow time.Duration
	// MaxLateCalls caps the calls running past UpstreamTimeout at once;
	// beyond it a call is cancelled at UpstreamTimeout. Zero holds none.
	MaxLateCalls int
	// LateCallsPrincipalShare caps the late calls one principal holds;
	// beyond it that principal's call is cancelled at UpstreamTimeout.
	// Zero: no cap of its own.
	LateCallsPrincipalShare int
	// Identity says where principals come from and whose headers are
	// believed.
	Identity Identity
	// PassThroughUpgrades are the protocols (Upgrade header values, e.g.
	// websocket) an unprotected request may switch to; every other
	// Upgrade, and every Upgrade on a protected route, is refused with 400
	// upgrade-refused. Nil refuses every upgrade.
	PassThroughUpgrades []string
	// Problems, when set, shapes idemproxy's own answers outside any
	// route (unmatched paths, refused upgrades); nil answers problem+json.
	Problems *problemfmt.Format
	// MaxBufferedBytes bounds the bytes held in request and response body
	// buffers at once; a protected request whose body would exceed it gets
	// 503 buffers-full before any claim. Zero holds without limit.
	MaxBufferedBytes int64
	// PrincipalShare is the most of MaxBufferedBytes one principal's
	// requests may hold at once; beyond, 429 too-many-bytes. Zero: no
	// share of its own.
	PrincipalShare int64
	// ProblemTypeBase starts every problem's type: a documentation URL
	// whose pages are named after the types, or "" for the URN
	// problemTypePrefix.
	ProblemTypeBase string
	// ProblemDocsURL, when set, is linked from every 400, 409 and 422 as
	// Link: <...>; rel="describedby" (the IETF draft asks for it).
	ProblemDocsURL string
	// Streams says the store writes streamed records (store.record_format
	// 4, not sealed): only then do routes with Stream relay streamed
	// answers as they arrive. Restart-only.
	Streams bool
	// Routes are the protected routes. Requests no route matches pass
	// through unprotected.
	Routes []Route
}

// Identity configures the principal's source and the trust boundary.
type Identity struct {
	// Source is where the principal comes from: SourceHeader (Header's
	// value, from a trusted peer), SourceXFCC (the URI SAN of
	// X-Forwarded-Client-Cert, from a trusted peer) or SourceJWT (a claim
	// of a verified bearer token in Authorization, from any peer: the
	// signature is the trust). Empty is SourceHeader.
	Source IdentitySource
	// Header is the identity header. It is honoured (SourceHeader) or
	// forwarded unchanged (the other sources) only from peers in
	// TrustedProxies; from anyone else it is removed from every request,
	// as X-Forwarded-Client-Cert is, whatever the source.
	Header string
	// JWT configures SourceJWT.
	JWT JWTConfig
	// TrustedProxies are the peers whose identity headers are believed.
	TrustedProxies []netip.Prefix
	// StripFromUntrusted are trust-bearing headers (X-Real-Ip, ...)
	// removed, under every spelling, from untrusted peers' requests.
	StripFromUntrusted []string
}

// IdentitySource names where principals come from.
type IdentitySource string

// The identity sources.
const (
	SourceHeader IdentitySource = "header"
	SourceXFCC   IdentitySource = "xfcc"
	SourceJWT    IdentitySource = "jwt"
)

// Route is one protected endpoint and its settings.
type Route struct {
	// Name labels metrics and logs and, unless SharedScope, scopes keys.
	Name string
	// Pattern is an http.ServeMux pattern with an upper-case method, e.g.
	// "POST /orders/{id}/capture".
	Pattern string
	// KeyHeader carries the idempotency key.
	KeyHeader string
	// RequireKey answers 400 to a request without a key; false forwards
	// it unprotected.
	RequireKey bool
	// SharedScope puts the route's keys in one space with every other
	// route that sets it (scope: principal); false scopes them by Name.
	SharedScope bool
	// Retention is how long a settled response is replayed.
	Retention time.Duration
	// Lease is how long a claim lasts unless renewed, every Lease/3.
	Lease time.Duration
	// Wait makes a retry that finds the first attempt in progress wait up
	// to MaxWait for its outcome; false answers it 409 at once.
	Wait    bool
	MaxWait time.Duration
	// ReleaseOn are the upstream statuses that release the claim.
	ReleaseOn []int
	// Unknown is what happens when the upstream may have acted without
	// an answer.
	Unknown Unknown
	// FailOpen forwards unprotected when the store is unavailable; false
	// answers 503.
	FailOpen bool
	// MaxRequestBody and MaxResponseBody cap the bodies read; a larger
	// request is refused, a larger response streamed and not replayable.
	MaxRequestBody, MaxResponseBody int64
	// FingerprintHeaders are hashed into the fingerprint besides method,
	// path, query and body; IgnoreJSONFields are JSON Pointers removed
	// from JSON bodies first.
	FingerprintHeaders []string
	IgnoreJSONFields   []string
	// AuthorizeURL, when not nil, is asked before a stored response is
	// replayed, or a 409 or 422 reveals that the key exists; 2xx allows
	// it, 401/403 refuses it. AuthorizeTimeout bounds the request.
	AuthorizeURL     *url.URL
	AuthorizeTimeout time.Duration
	// QuotaNewKeys, when positive, is how many new keys one principal may
	// claim on the route per QuotaWindow; beyond, 429 too-many-keys.
	QuotaNewKeys int64
	QuotaWindow  time.Duration
	// InProgressStatus answers a retry while the first attempt runs: 409
	// (zero), 429 or 503, with Retry-After.
	InProgressStatus int
	// MaxInFlight, when positive, bounds the first attempts of the route
	// this process forwards at once: beyond it a new key's claim is
	// released and the request answered 503 overloaded with Retry-After.
	// Replays and in-progress answers never count.
	MaxInFlight int
	// MaxInFlightShare is the most of MaxInFlight one principal holds at
	// once (zero: MaxInFlight); principals that hold some leave this many
	// free for those that hold none.
	MaxInFlightShare int
	// FirstSent are where a request's first-sent time comes from, in
	// order (firstsent.go); empty: never. FirstSentSkew is how far behind
	// a client's clock may be.
	FirstSent     []FirstSentSource
	FirstSentSkew time.Duration
	// Webhook, when set, makes the route a webhook receiver (webhook.go).
	Webhook *Webhook
	// Reconcile, when set, asks the upstream what happened where the
	// outcome would be unknown (reconcile.go).
	Reconcile *Reconcile
	// Stream relays a streamed answer (stream.go) as it arrives, stored
	// chunk by chunk, when Config.Streams allows; false buffers it whole.
	Stream bool
	// StreamFlushInterval, when positive, stores (and hands on) at most
	// one part of a stream per interval (coalesce.go); zero stores and
	// sends each read at once.
	StreamFlushInterval time.Duration
	// KeyJSONPointer, when set, takes the key from this member of a JSON
	// body when the key header is absent (a string, or an integer in
	// decimal); the route then reads bodies before the key.
	KeyJSONPointer string
	// Protocol frames the route's calls and idemproxy's own answers:
	// ProtocolHTTP (or empty), ProtocolGRPC or ProtocolConnect.
	Protocol string
	// GRPCKeyField, on a grpc route, is the request message's string
	// field that keys a call without the key metadata; zero: none.
	GRPCKeyField int
	// GRPCRelease are the answered gRPC statuses that free the key.
	GRPCRelease []int
	// Problems, when set, shapes idemproxy's own answers on the route;
	// nil uses Config.Problems, or problem+json.
	Problems *problemfmt.Format
	// AdvertiseRetention sets Idempotency-Retention (seconds, not a
	// standard header) on stored answers and replays.
	AdvertiseRetention bool
	// ExcludeHeaders are upstream response headers never stored nor
	// replayed (Set-Cookie); the first client still gets them.
	ExcludeHeaders []string
}

// Unknown is what an owner does when the upstream may have acted without
// an answer (unknown_outcome).
type Unknown int

// The values of Unknown.
const (
	// Keep holds the claim one more lease, then lets it lapse.
	Keep Unknown = iota
	// Release frees the key at once.
	Release
	// Fail stores a 502 outcome-unknown, replayed to every retry; claims
	// then outlive their lease by Retention, so that a vanished owner's
	// claim is settled the same way by the next attempt.
	Fail
)

func (u Unknown) String() string {
	switch u {
	case Release:
		return "release"
	case Fail:
		return "fail"
	}
	return "keep"
}

// FirstSentSource is where a request's first-sent time comes from.
type FirstSentSource int

// First-sent sources.
const (
	// FirstSentHeader reads Repeatability-First-Sent, an HTTP date.
	FirstSentHeader FirstSentSource = iota + 1
	// FirstSentUUIDv7 reads the key's timestamp when the key is a UUIDv7.
	FirstSentUUIDv7
)

// Reconcile is how a route asks the upstream what happened to a key
// whose outcome idemproxy cannot know (routes[].reconcile): a GET of URL,
// its {key}, {principal} and {route} replaced by their values escaped
// for where they stand, carrying the identity header with the principal
// and the key header with the key.
type Reconcile struct {
	// URL is the template: a path, with an optional query, joined to the
	// upstream URL's path as a forwarded request's is.
	URL string
	// Found are the statuses that say the effect happened: that answer
	// is stored and replayed (with Status, when set). Absent are the ones
	// that say it did not.
	Found, Absent []int
	Status        int
	// Timeout bounds one lookup.
	Timeout time.Duration
	// AbsentAfter is how old a first attempt must be, on Redis' clock,
	// before an absent answer is believed: no request runs longer in the
	// app (at least the upstream timeout and late-answer window).
	AbsentAfter time.Duration
}

// Webhook is a route's webhook receiver.
type Webhook struct {
	// Provider is WebhookStripe, WebhookGitHub, WebhookShopify or
	// WebhookStandard.
	Provider string
	// Secrets are the signing secrets as their files hold them; any one
	// verifies (rotation).
	Secrets [][]byte
	// Tolerance bounds how far a signed timestamp (stripe, standard) may
	// be from now; zero: 5 minutes.
	Tolerance time.Duration
	// Events, for a provider whose event is not signed (github,
	// shopify), are the events the route accepts; nil: every well-formed
	// one.
	Events []string
}
