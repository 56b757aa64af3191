package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"go.opentelemetry.io/otel/trace"
)

// newForwarder builds a peer's pair from base, which carries what all of
// them share (error log, buffer pool).
func (h *Handler) newForwarder(base httputil.ReverseProxy, transport http.RoundTripper, trustedPeer bool) forwarder {
	base.Rewrite = func(pr *httputil.ProxyRequest) { h.rewrite(pr, trustedPeer) }
	protected, direct := base, base
	protected.Transport = &ownerTransport{next: transport}
	protected.ModifyResponse = h.modifyResponse
	protected.ErrorHandler = h.errorHandler
	direct.Transport = transport
	direct.ErrorHandler = h.passThroughError
	return forwarder{protected: &protected, direct: &direct}
}

// forwarder returns the ReverseProxies for a peer.
func (h *Handler) forwarder(trustedPeer bool) *forwarder {
	if trustedPeer {
		return &h.trustedPeer
	}
	return &h.otherPeer
}

// rewrite directs every request to the upstream. It runs inside
// ReverseProxy for protected and pass-through requests alike.
func (h *Handler) rewrite(pr *httputil.ProxyRequest, trustedPeer bool) {
	if trustedPeer {
		// A trusted mesh proxy's X-Forwarded-For is the real client chain.
		pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	}
	// Request trailers arrive after idemproxy read the headers: none may
	// carry identity or forwarding information to the upstream.
	for k := range pr.Out.Trailer {
		if sameName(k, h.id.header) || forwardingHeaders.has(k) {
			delete(pr.Out.Trailer, k)
		}
	}
	pr.SetURL(h.upstream)
	pr.SetXForwarded()
	pr.Out.Host = pr.In.Host
	// Never let the Transport resend a request on its own: it treats a
	// body-less request carrying Idempotency-Key as replayable, and resends
	// it when a reused connection dies after the upstream acted. A non-nil
	// body that is not http.NoBody, and no GetBody, make it unreplayable.
	pr.Out.GetBody = nil
	o := ownerFrom(pr.In.Context())
	if o != nil && o.x.rt.grpc {
		// Over HTTP/2 the transport resends only a call the upstream
		// provably never saw (REFUSED_STREAM, a GOAWAY below the
		// stream's id, a connection that never took it), and it needs
		// the body again to do so: a refused call is then sent, not
		// settled as an unknown outcome. It asks within RoundTrip, while
		// the owner holds o.body, and waits 1 s, then 2 s... before each
		// resend: after maxResends the call fails as never sent.
		body, resends := o.body, 0
		pr.Out.GetBody = func() (io.ReadCloser, error) {
			if resends++; resends > maxResends {
				return nil, errNeverSeen
			}
			return io.NopCloser(bytes.NewReader(body)), nil
		}
	}
	if o != nil && o.copied != nil && pr.In.Body == o.copied {
		// ReverseProxy wraps every body (so that the transport's Close
		// cannot reach the inbound one), which hides that this one is in
		// memory: the owner's copy of a small body (forwardBody) closes
		// nothing, and unwrapped it goes out with the headers.
		pr.Out.Body = o.copied
	}
	if pr.Out.Body == nil || pr.Out.Body == http.NoBody {
		switch pr.Out.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		default:
			pr.Out.Body = emptyBody{}
		}
	}
}

// maxResends is how many times a call the upstream never saw is sent
// again (Go's HTTP/2 transport backs off 1 s, then 2 s).
const maxResends = 2

// errNeverSeen fails a call the upstream refused each time it was sent:
// it never saw it, so the key is freed.
var errNeverSeen = errors.New("the upstream refused the call each time it was sent (REFUSED_STREAM, or a GOAWAY before it): it never saw it")

// emptyBody is an empty request body that http.Transport cannot replay.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }

func (emptyBody) Close() error { return nil }

// passThroughError answers an unprotected request the upstream gave no
// usable response to.
func (h *Handler) passThroughError(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Warn("upstream error on pass-through request", "method", r.Method, "err", err)
	h.problems.write(w, probUpstreamDown.with("the upstream could not be reached"), r.Header.Get(requestIDHeader), nil)
}

// ownerTransport retries, once, a protected request that provably never
// reached the upstream (a stale keep-alive connection, a refused dial), with
// a fresh body. http.Transport itself will not, since the body cannot be
// rewound, and must not, since it cannot tell "not sent" from "sent".
type ownerTransport struct {
	next http.RoundTripper
}

func (t *ownerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	o := ownerFrom(req.Context())
	if o != nil && o.x.span != nil {
		req, sp := o.upstreamSpan(req)
		resp, err := t.roundTrip(o, req)
		endUpstreamSpan(sp, resp, err)
		return resp, err
	}
	return t.roundTrip(o, req)
}

func (t *ownerTransport) roundTrip(o *owner, req *http.Request) (*http.Response, error) {
	if o != nil && !o.held.mayForward() {
		return nil, errClaimTooLate
	}
	resp, err := t.next.RoundTrip(req)
	if err == nil || o == nil || o.wrote.Load() || req.Context().Err() != nil {
		return resp, err
	}
	if !o.held.mayForward() {
		return nil, errClaimTooLate
	}
	retry := req.Clone(req.Context())
	if len(o.body) == 0 {
		retry.Body = emptyBody{}
	} else {
		retry.Body = o.forwardBody()
	}
	return t.next.RoundTrip(retry)
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 || w.status < 200 { // a 1xx may precede the final status
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type readCloser struct {
	io.Reader
	io.Closer
}

// passThrough forwards a request no route protects, streamed as it is. Its
// body may not pause longer than the body read timeout: a client that
// declares a body and stalls would otherwise hold an upstream connection,
// and on a sync-worker upstream a worker, for as long as it likes.
func (h *Handler) passThrough(w http.ResponseWriter, r *http.Request, trusted bool) {
	sw := &statusWriter{ResponseWriter: w}
	if h.tracing != nil {
		var sp trace.Span
		r, sp = h.tracing.serverSpan(r, trusted, time.Now(), r.Method, []attribute.KeyValue{semconv.URLPath(r.URL.Path)})
		defer func() { endServerSpan(sp, sw.code()) }()
	}
	defer func() { h.metrics.passThroughClass[min(max(sw.code()/100, 1), 5)].Inc() }()
	if r.Body != nil && r.Body != http.NoBody {
		b := &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: h.bodyTimeout}
		r.Body = b
		defer b.stop()
	}
	h.forwarder(trusted).direct.ServeHTTP(sw, r)
}

// code is the status answered; 0 (no answer: the client went away first)
// counts as 499, nginx's "client closed request".
func (w *statusWriter) code() int {
	if w.status == 0 {
		return 499
	}
	return w.status
}

// idleBody moves the client connection's read deadline forward before each
// read of the body, so that the body may take as long as it needs but never
// pause longer than idle.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration

	mu      sync.Mutex // guards stopped, armed and the deadline
	stopped bool
	// armed is set while a deadline is on the connection: stop clears it
	// only then (a body read to its end cleared it already).
	armed bool
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return 0, errBodyReturned
	}
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	b.armed = true
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		// net/http now watches the connection for the client going away;
		// a deadline left on it would read as the client leaving.
		b.clear()
	}
	return n, err
}

func (b *idleBody) clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.stopped && b.armed {
		_ = b.rc.SetReadDeadline(time.Time{})
		b.armed = false
	}
}

// stop clears the deadline and ends reads through b; the handler calls it
// before it returns, after which the ResponseController must not be used.
func (b *idleBody) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.stopped && b.armed {
		_ = b.rc.SetReadDeadline(time.Time{})
		b.armed = false
	}
	b.stopped = true
}
