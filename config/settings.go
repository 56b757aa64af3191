package config

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idemproxy/idemproxy/internal/jsonpointer"
	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

// DefaultReleaseOn are the upstream statuses that declare the request was not
// acted upon, so the claim is released and a retry really retries.
var DefaultReleaseOn = []int{429, 503}

// DefaultFingerprintHeaders are the request headers that take part in the
// fingerprint unless configured otherwise.
var DefaultFingerprintHeaders = []string{"Content-Type"}

// First-sent sources (defaults.first_sent).
const (
	FirstSentHeader = "header"
	FirstSentUUIDv7 = "uuidv7"
)

// FirstSentSources are the values defaults.first_sent lists.
var FirstSentSources = []string{FirstSentHeader, FirstSentUUIDv7}

// Scope values: which identities share a key space.
const (
	ScopeRoute     = "route"     // principal + route + key
	ScopePrincipal = "principal" // principal + key, shared across routes
)

// Concurrent values: what a retry does while the first attempt runs.
const (
	ConcurrentReject = "reject" // 409 with Retry-After
	ConcurrentWait   = "wait"   // wait up to max_wait for the outcome
)

// UnknownOutcome values: what happens to the claim when the upstream may
// have received the request but gave no answer.
const (
	OutcomeKeep    = "keep"    // hold the claim one more lease, then let it lapse
	OutcomeRelease = "release" // free the key at once
	// OutcomeFail stores a replayable 502 outcome-unknown for the key, so
	// nothing executes again; a claim whose owner vanished is settled the
	// same way by the next attempt that finds it.
	OutcomeFail = "fail"
)

// UnknownOutcomes are the values unknown_outcome accepts.
var UnknownOutcomes = []string{OutcomeKeep, OutcomeRelease, OutcomeFail}

// StoreUnavailable values: what happens when Redis cannot be reached.
const (
	FailClosed = "fail_closed" // 503 + Retry-After, nothing forwarded
	FailOpen   = "fail_open"   // forward unprotected, counted and logged
)

// Settings are the per-route knobs. defaults: sets them for all routes and
// each route may override any of them.
type Settings struct {
	// KeyHeader names the header carrying the idempotency key.
	KeyHeader string `yaml:"key_header"`
	// RequireKey refuses a request without a key (400); false forwards it
	// unprotected.
	RequireKey bool `yaml:"require_key"`
	// Scope is ScopeRoute (keys are per principal and route) or
	// ScopePrincipal (per principal, shared by every such route).
	Scope string `yaml:"scope"`
	// Retention is how long a settled answer is replayed.
	Retention time.Duration `yaml:"retention"`
	// Lease is how long a claim holds without renewal; the owner renews
	// it every Lease/3 while the upstream runs.
	Lease time.Duration `yaml:"lease"`
	// Concurrent is "reject" (a retry while the first attempt runs gets
	// the in-progress answer) or "wait" (it waits up to MaxWait).
	Concurrent string `yaml:"concurrent"`
	// MaxWait bounds a waiting retry (Concurrent "wait").
	MaxWait time.Duration `yaml:"max_wait"`
	// ReleaseOn are the upstream statuses that free the key unstored:
	// the upstream declares it did not act.
	ReleaseOn []int `yaml:"release_on"`
	// UnknownOutcome is what a key whose upstream may have acted without
	// an answer becomes: "keep", "release" or "fail".
	UnknownOutcome string `yaml:"unknown_outcome"`
	// StoreUnavailable is "fail_closed" (503, nothing forwarded) or
	// "fail_open" (forwarded unprotected) when no claim can be made.
	StoreUnavailable string `yaml:"store_unavailable"`
	// MaxRequestBody caps a protected request's body (413 beyond).
	MaxRequestBody int64 `yaml:"max_request_body"`
	// MaxResponseBody caps a stored answer, headers included; a larger one
	// is passed on and stored without its body.
	MaxResponseBody int64 `yaml:"max_response_body"`
	// Fingerprint selects what identifies a request besides its method,
	// path, query and body.
	Fingerprint Fingerprint `yaml:"fingerprint"`
	// Replay configures re-authorization before a replay.
	Replay Replay `yaml:"replay"`
	// ResponseHeaders selects the upstream headers never stored.
	ResponseHeaders ResponseHeaders `yaml:"response_headers"`
	// Quota bounds the new keys one principal claims per window.
	Quota Quota `yaml:"quota"`
	// InProgressStatus is the status of the answer to a retry while the
	// first attempt runs: 409 (the IETF draft's), or 429 or 503, which
	// generic retrying clients retry; Retry-After either way.
	InProgressStatus int `yaml:"in_progress_status"`
	// MaxInFlight, when positive, bounds the first attempts of the route
	// one process forwards at once; beyond it a new key is answered 503
	// overloaded with Retry-After, its claim released, nothing forwarded.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxInFlightPrincipalShare is the most of MaxInFlight one principal's
	// first attempts hold at once (at least one); principals that hold
	// some leave as many free for those that hold none.
	MaxInFlightPrincipalShare float64 `yaml:"max_in_flight_principal_share"`
	// FirstSent says where a request's first-sent time comes from, in
	// order: header (Repeatability-First-Sent, an HTTP date) and uuidv7
	// (the key is a UUIDv7: its timestamp). A new claim for a request
	// first sent longer ago than the retention, or before the store lost
	// its data, is refused 412 instead of executed. Empty: never.
	FirstSent []string `yaml:"first_sent"`
	// FirstSentSkew is how far behind a client's clock may be: a request
	// first sent within it of the retention's edge or of the epoch's
	// start still executes.
	FirstSentSkew time.Duration `yaml:"first_sent_skew"`
	// StreamFlushInterval, when positive, stores and sends a streamed
	// answer (routes[].stream) at most once per interval: the first event
	// after a quiet interval at once, those that follow it closely
	// together at the interval's end. Zero stores and sends each read at
	// once.
	StreamFlushInterval time.Duration `yaml:"stream_flush_interval"`
	// KeyJSONPointer, when set, takes the key from this member of a JSON
	// body (a string, or an integer in decimal) when the key header is
	// absent; a request that has both must agree. It makes the route read
	// bodies before the key.
	KeyJSONPointer string `yaml:"key_json_pointer"`
	// ProblemBody, when set, is a Go text/template for the body of every
	// answer idemproxy makes itself on the route (internal/problemfmt's
	// Data), in ProblemContentType (application/json when empty); empty
	// answers problem+json.
	ProblemBody        string `yaml:"problem_body"`
	ProblemContentType string `yaml:"problem_content_type"`
	// AdvertiseRetention sets Idempotency-Retention (seconds; not a
	// standard header) on stored answers and replays.
	AdvertiseRetention bool `yaml:"advertise_retention"`
}

// Quota bounds how many new keys one principal may claim on a route per
// window, counted in Redis and shared by every replica.
type Quota struct {
	// NewKeys is how many new keys a window allows; 0 counts nothing.
	NewKeys int `yaml:"new_keys"`
	// Window starts at a principal's first new key and lasts this long.
	Window time.Duration `yaml:"window"`
}

// ResponseHeaders selects which upstream response headers are stored.
type ResponseHeaders struct {
	// Exclude are never stored and never replayed; the first client still
	// gets them. Session cookies belong to the attempt that got them.
	Exclude []string `yaml:"exclude"`
}

// DefaultResponseHeadersExclude are the response headers never stored.
var DefaultResponseHeadersExclude = []string{"Set-Cookie"}

// Replay configures re-authorization before a stored response is revealed.
type Replay struct {
	// AuthorizeURL, when set, is asked (GET, with the request's identity,
	// Authorization and Cookie headers, X-Original-Method and
	// X-Original-URI) before a replay, a 409 or a 422 reveals that the key
	// exists; 2xx allows it, 401/403 refuses it. Empty authorizes nothing
	// again: the stored response is replayed to its principal.
	AuthorizeURL string `yaml:"authorize_url"`
	// AuthorizeTimeout bounds that request.
	AuthorizeTimeout time.Duration `yaml:"authorize_timeout"`
}

// Fingerprint selects what, besides method, path, query and body, identifies
// a request.
type Fingerprint struct {
	// Headers are request headers hashed into the fingerprint; media types
	// are normalised.
	Headers []string `yaml:"headers"`
	// IgnoreJSONFields are JSON Pointers (RFC 6901) removed from JSON bodies
	// before hashing, for fields that change on every attempt.
	IgnoreJSONFields []string `yaml:"ignore_json_fields"`
}

// DefaultSettings returns the built-in per-route settings.
func DefaultSettings() Settings {
	return Settings{
		KeyHeader:        DefaultKeyHeader,
		RequireKey:       DefaultRequireKey,
		Scope:            DefaultScope,
		Retention:        DefaultRetention,
		Lease:            DefaultLease,
		Concurrent:       DefaultConcurrent,
		MaxWait:          DefaultMaxWait,
		ReleaseOn:        append([]int(nil), DefaultReleaseOn...),
		UnknownOutcome:   DefaultUnknownOutcome,
		StoreUnavailable: DefaultStoreUnavailable,
		MaxRequestBody:   DefaultMaxRequestBody,
		MaxResponseBody:  DefaultMaxResponseBody,
		Fingerprint:      Fingerprint{Headers: append([]string(nil), DefaultFingerprintHeaders...)},
		Replay:           Replay{AuthorizeTimeout: DefaultAuthorizeTimeout},
		ResponseHeaders:  ResponseHeaders{Exclude: slices.Clone(DefaultResponseHeadersExclude)},
		Quota:            Quota{Window: DefaultQuotaWindow},
		InProgressStatus: http.StatusConflict,

		MaxInFlightPrincipalShare: DefaultPrincipalShare,
		FirstSent:                 []string{FirstSentHeader},
		FirstSentSkew:             DefaultFirstSentSkew,
	}
}

func (s *Settings) validate(path string, add func(path, format string, args ...any)) {
	if !validToken(s.KeyHeader) {
		add(path+"key_header", "%q is not a valid header name", s.KeyHeader)
	}
	oneOf(path+"scope", s.Scope, add, ScopeRoute, ScopePrincipal)
	oneOf(path+"concurrent", s.Concurrent, add, ConcurrentReject, ConcurrentWait)
	oneOf(path+"unknown_outcome", s.UnknownOutcome, add, UnknownOutcomes...)
	oneOf(path+"store_unavailable", s.StoreUnavailable, add, FailClosed, FailOpen)
	if s.InProgressStatus != http.StatusConflict && s.InProgressStatus != http.StatusTooManyRequests && s.InProgressStatus != http.StatusServiceUnavailable {
		add(path+"in_progress_status", "must be 409, 429 or 503, got %d", s.InProgressStatus)
	}
	if s.MaxInFlight < 0 {
		add(path+"max_in_flight", "must be 0 (no bound) or positive, got %d", s.MaxInFlight)
	}
	for i, src := range s.FirstSent {
		oneOf(fmt.Sprintf("%sfirst_sent[%d]", path, i), src, add, FirstSentSources...)
	}
	if s.FirstSentSkew < 0 || s.FirstSentSkew > time.Hour {
		add(path+"first_sent_skew", "must be between 0s and 1h, got %s", s.FirstSentSkew)
	}
	if s.StreamFlushInterval < 0 || s.StreamFlushInterval > time.Second {
		add(path+"stream_flush_interval", "must be between 0s (each read stored and sent at once) and 1s, got %s", s.StreamFlushInterval)
	}
	if s.MaxInFlightPrincipalShare <= 0 || s.MaxInFlightPrincipalShare > 1 {
		add(path+"max_in_flight_principal_share", "must be more than 0%% and at most 100%%, got %g%%", s.MaxInFlightPrincipalShare*100)
	}
	if s.KeyJSONPointer != "" {
		if _, err := jsonpointer.Parse(s.KeyJSONPointer); err != nil {
			add(path+"key_json_pointer", "%v", err)
		}
	}
	if _, err := problemfmt.Parse(s.ProblemBody, s.ProblemContentType); err != nil {
		add(path+"problem_body", "%v", err)
	}
	if s.ProblemBody == "" && s.ProblemContentType != "" {
		add(path+"problem_content_type", "goes with problem_body, which is empty")
	}
	s.validateBounds(path, add)
}

// validateBounds checks the durations, sizes, header names and quotas of
// s (validate's second half, in the same order).
func (s *Settings) validateBounds(path string, add func(path, format string, args ...any)) {
	if s.Lease < MinLease {
		add(path+"lease", "must be at least %s, got %s", MinLease, s.Lease)
	}
	if s.Retention < s.Lease {
		add(path+"retention", "must not be shorter than lease (%s), got %s", s.Lease, s.Retention)
	}
	if s.MaxWait < 0 {
		add(path+"max_wait", "must not be negative, got %s", s.MaxWait)
	}
	for i, code := range s.ReleaseOn {
		if code < 100 || code > 599 {
			add(fmt.Sprintf("%srelease_on[%d]", path, i), "must be an HTTP status between 100 and 599, got %d", code)
		}
	}
	if s.MaxRequestBody <= 0 {
		add(path+"max_request_body", "must be positive, got %d", s.MaxRequestBody)
	}
	if s.MaxResponseBody <= 0 {
		add(path+"max_response_body", "must be positive, got %d", s.MaxResponseBody)
	}
	for i, h := range s.Fingerprint.Headers {
		if !validToken(h) {
			add(fmt.Sprintf("%sfingerprint.headers[%d]", path, i), "%q is not a valid header name", h)
		}
	}
	for i, p := range s.Fingerprint.IgnoreJSONFields {
		if _, err := jsonpointer.Parse(p); err != nil {
			add(fmt.Sprintf("%sfingerprint.ignore_json_fields[%d]", path, i), "%v", err)
		}
	}
	if u := s.Replay.AuthorizeURL; u != "" {
		if _, ok := httpURL(u); !ok {
			add(path+"replay.authorize_url", "must be an absolute http or https URL, got %q", u)
		}
	}
	for i, h := range s.ResponseHeaders.Exclude {
		if !validToken(h) {
			add(fmt.Sprintf("%sresponse_headers.exclude[%d]", path, i), "%q is not a valid header name", h)
		}
	}
	if s.Quota.NewKeys < 0 {
		add(path+"quota.new_keys", "must not be negative, got %d", s.Quota.NewKeys)
	}
	if s.Quota.NewKeys > 0 && s.Quota.Window < time.Second {
		add(path+"quota.window", "must be at least 1s when quota.new_keys is set, got %s", s.Quota.Window)
	}
	if s.Replay.AuthorizeTimeout <= 0 {
		add(path+"replay.authorize_timeout", "must be positive, got %s", s.Replay.AuthorizeTimeout)
	}
}
