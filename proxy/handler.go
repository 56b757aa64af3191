package proxy

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Options are the optional collaborators of a Handler.
type Options struct {
	// Transport sends requests to the upstream. Nil uses NewTransport().
	// It must not resend a request it may have written: *http.Transport
	// does not, for the requests this package builds.
	Transport http.RoundTripper
	// Logger receives one line per protected request and every anomaly.
	// Nil discards logs.
	Logger *slog.Logger
	// Metrics collects counters and latencies. Nil creates unregistered
	// collectors.
	Metrics *Metrics
	// Rand is the source of owner tokens and request ids. Nil uses
	// crypto/rand.
	Rand io.Reader
	// WaitSafetyPoll is the longest a waiting retry goes without looking
	// at the key, should the message that wakes it be lost. Zero uses
	// defaultWaitSafetyPoll.
	WaitSafetyPoll time.Duration
	// TracerProvider, when set, traces protected requests (trace.go);
	// Propagator reads and writes trace context in headers, nil using W3C
	// traceparent.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
	// TraceTrust says whose incoming traceparent may be a span's parent:
	// TraceTrustTrustedPeers (zero: trusted proxies only), TraceTrustAll or
	// TraceTrustNone. Another peer's is at most a link: it never makes the
	// span sampled, and its tracestate and baggage are dropped.
	TraceTrust TraceTrust
	// Version is the instrumentation scope version of the spans: the
	// build's version. Empty leaves it unset.
	Version string
	// Clock, when set, is this process' wall clock: the times it writes
	// for other processes to read (a claim's Created, a record's
	// Completed) and compares with theirs. Its own deadlines run on
	// time.Now's monotonic clock, whatever Clock says, as a real clock's
	// step leaves them. Nil: time.Now. The chaos harness's build
	// (-tags chaosclock) steps it together with the store's.
	Clock func() time.Time
}

// defaultWaitSafetyPoll is how often, at least, a waiting retry looks at
// its key when no message wakes it.
const defaultWaitSafetyPoll = 5 * time.Second

// defaultWriteTimeout is how long a client may take nothing of an answer.
const defaultWriteTimeout = 30 * time.Second

// defaultBodyReadTimeout is how long a client may take to send a protected
// request's body.
const defaultBodyReadTimeout = 30 * time.Second

// Handler is the idemproxy HTTP handler, the HTTP front: protected routes
// go through the claim protocol (p, shared by every attempt), everything
// else streams straight to the upstream.
type Handler struct {
	// p is the protocol the exchanges' attempts run on.
	p *protocol
	// routes is swapped whole by Reload; a request uses the routes it
	// matched against from start to end.
	routes   atomic.Pointer[router]
	id       identity
	upstream *url.URL
	// forwarders send requests to the upstream, one set for trusted peers
	// and one for the rest, so that trust is decided once per request.
	trustedPeer, otherPeer forwarder
	log                    *slog.Logger
	metrics                *Metrics
	bodyTimeout            time.Duration
	tracing                *tracing
	// problems writes every error answer (problem.go).
	problems problemWriter
	// writeTimeout is client.write_timeout in nanoseconds (it reloads).
	writeTimeout atomic.Int64
	// relied are the headers no request may nominate as hop-by-hop: the
	// forwarding headers and the identity header (a route adds its key).
	relied nameSet
	// authClient asks replay authorizers; it follows no redirects.
	authClient *http.Client
	// passUpgrades are the protocols an unprotected request may switch to.
	passUpgrades []string
}

// Reload replaces the routes and their settings. Requests in flight finish
// with the settings they started with.
func (h *Handler) Reload(routes []Route) error {
	rt, err := newRouter(routes)
	if err != nil {
		return err
	}
	h.frame(rt)
	h.metrics.initRoutes(rt)
	h.routes.Store(rt)
	return nil
}

// frame gives every route of rt its front's framer: on an HTTP route
// problem+json, or the route's problem_body; gRPC's statuses; Connect's
// errors.
func (h *Handler) frame(rt *router) {
	for _, r := range rt.byName {
		switch r.settings.Protocol {
		case ProtocolGRPC:
			r.front = grpcFramer{}
		case ProtocolConnect:
			r.front = connectFramer{}
		default:
			r.front = httpFramer{pw: &h.problems, format: r.settings.Problems}
		}
	}
}

// SetWriteTimeout sets how long a client may take nothing of an answer
// idemproxy writes before it is cut (client.write_timeout, which reloads);
// zero or less uses defaultWriteTimeout.
func (h *Handler) SetWriteTimeout(d time.Duration) {
	if d <= 0 {
		d = defaultWriteTimeout
	}
	h.writeTimeout.Store(int64(d))
}

// RouteScope is the key scope (see KeyScope) of the route named name in
// the routes serving now, reloads included; false when there is none.
func (h *Handler) RouteScope(name string) (string, bool) {
	scope, ok := h.routes.Load().scopes[name]
	return scope, ok
}

// RouteNames are the names of the routes serving now, in config order.
func (h *Handler) RouteNames() []string { return slices.Clone(h.routes.Load().names) }

// Waiting is how many retries wait for a first attempt's outcome now
// (concurrent: wait).
func (h *Handler) Waiting() int { return int(h.p.waiting.Load()) }

// BufferedBytes is how many bytes request and response body buffers hold
// now (limits.max_buffered_bytes bounds it).
func (h *Handler) BufferedBytes() int64 { return h.p.buffers.counts.count() }

// dropping is a log handler that drops the records whose message holds
// drop: ReverseProxy's own line for a stream idemproxy broke off, which
// says nothing of the request; the pump logs it with its route, key and
// request id.
type dropping struct {
	slog.Handler
	drop string
}

// Handle drops r when its message holds d.drop.
func (d dropping) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, d.drop) {
		return nil
	}
	return d.Handler.Handle(ctx, r)
}

// newRequestID is a fresh request id: 16 bytes of rand, in hex.
func newRequestID(rand io.Reader) string {
	var b [16]byte
	_, _ = io.ReadFull(rand, b[:]) // crypto/rand does not fail
	return hex.EncodeToString(b[:])
}
