package proxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"time"
)

// One protected request's way, from New's Handler to finish: ServeHTTP
// matches the route and refuses what no route may carry; the exchange
// admits the request, builds its attempt, claims or answers, and finish
// counts and logs it once. This is the top of the package: it uses
// everything below it, and nothing below uses it.

// New builds a Handler for cfg, which the caller has validated: a route
// pattern http.ServeMux refuses panics there. It fails on JSON Pointers
// that do not parse.
func New(cfg Config, store Store, opts Options) (*Handler, error) {
	switch cfg.Identity.Source {
	case "", SourceHeader, SourceXFCC, SourceJWT:
	default:
		return nil, fmt.Errorf("proxy: unknown identity source %q", cfg.Identity.Source)
	}
	routes, err := newRouter(cfg.Routes)
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	metrics := opts.Metrics
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	p := newProtocol(cfg, store, opts, log, metrics)
	h := &Handler{
		p:            p,
		id:           newIdentity(cfg.Identity, &http.Client{Timeout: jwksFetchTimeout}),
		upstream:     cfg.Upstream,
		log:          log,
		metrics:      metrics,
		bodyTimeout:  cfg.BodyReadTimeout,
		tracing:      newTracing(opts.TracerProvider, opts.Propagator, opts.TraceTrust, opts.Version),
		passUpgrades: slices.Clone(cfg.PassThroughUpgrades),
	}
	p.lookup = h.lookup
	if h.bodyTimeout <= 0 {
		h.bodyTimeout = defaultBodyReadTimeout
	}
	h.SetWriteTimeout(cfg.WriteTimeout)
	h.relied = append(slices.Clone(forwardingHeaders), h.id.header)
	h.problems = problemWriter{base: cmp.Or(cfg.ProblemTypeBase, problemTypePrefix), outside: cfg.Problems, log: h.log}
	if cfg.ProblemDocsURL != "" {
		h.problems.docsLink = "<" + cfg.ProblemDocsURL + `>; rel="describedby"`
	}
	h.frame(routes)
	h.routes.Store(routes)
	h.metrics.initRoutes(routes)
	h.metrics.state.Store(&gaugeState{
		inflight: p.owners.count, oldest: p.owners.oldest, buffered: h.BufferedBytes, waiting: h.Waiting, pending: p.unconfirmed.count,
	})
	h.connect(opts.Transport)
	return h, nil
}

// newProtocol is the protocol every attempt of cfg's routes shares, on
// store, logging to log and counting in metrics.
func newProtocol(cfg Config, store Store, opts Options, log *slog.Logger, metrics *Metrics) *protocol {
	p := &protocol{
		store:           store,
		codec:           codecOf(store),
		log:             log,
		metrics:         metrics,
		rand:            cmp.Or[io.Reader](opts.Rand, rand.Reader),
		now:             opts.Clock,
		safetyPoll:      cmp.Or(opts.WaitSafetyPoll, defaultWaitSafetyPoll),
		upstreamTimeout: cfg.UpstreamTimeout,
		lateWindow:      cfg.LateAnswerWindow,
		streams:         cfg.Streams,
		liveness:        newLiveness(),
		orphans:         newOrphans(),
		buffers:         budget{limit: cfg.MaxBufferedBytes, share: cfg.PrincipalShare},
		late:            lateCalls{max: int64(cfg.MaxLateCalls), share: int64(cfg.LateCallsPrincipalShare)},
		owners:          claimAges{started: map[*context.CancelCauseFunc]time.Time{}, now: time.Now},
		unconfirmed:     unconfirmed{store: store, metrics: metrics, log: log, now: time.Now},
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p
}

// connect sets up what reaches the upstream through transport: the
// forwarders (trusted peers and others) and the client of auth checks;
// nil is NewTransport().
func (h *Handler) connect(transport http.RoundTripper) {
	if transport == nil {
		transport = NewTransport()
	}
	if t, ok := transport.(*http.Transport); ok {
		transport = grpcAware{http1: t, h2c: h2cTransport(t)}
	}
	// FlushInterval stays 0: ReverseProxy already flushes every write of a
	// streamed response (SSE, or no Content-Length), and flushing every
	// write of the rest cost pass-through 40% of its throughput
	// (docs/benchmarks.md, "Tuning done").
	base := httputil.ReverseProxy{
		ErrorLog:   slog.NewLogLogger(dropping{h.log.Handler(), errStreamAborted.Error()}, slog.LevelWarn),
		BufferPool: newBufferPool(),
	}
	h.authClient = &http.Client{
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	h.trustedPeer = h.newForwarder(base, transport, true)
	h.otherPeer = h.newForwarder(base, transport, false)
}

// Abandon cancels every upstream call of a protected request still
// running, and any that starts later; each is then settled by its route's
// unknown_outcome. A drain calls it when drain.timeout runs out, so that
// no claim is left to the dual-write window by the process exiting. It
// returns the number of calls cancelled.
func (h *Handler) Abandon() int {
	h.p.abandoned.Store(true)
	n := 0
	h.p.owners.each(func(cancel context.CancelCauseFunc) {
		cancel(errAbandoned)
		n++
	})
	return n
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	trusted, idErr := h.id.admit(r)
	var refused problem
	switch {
	case idErr != nil:
		refused = probIdentityInvalid.with(idErr.Error())
	default:
		if tok := nominated(r.Header, h.relied); tok != "" {
			refused = probHopByHop.with("Connection nominates " + tok + ", which idemproxy and the upstream rely on")
		}
	}
	rt, path := h.routes.Load().match(r)
	if up := upgradeType(r.Header); up != "" && refused.Status == 0 {
		switch {
		case rt != nil:
			refused = probUpgradeRefused.with("a protected route never switches protocols (Upgrade: " + up + "): its outcome could not be stored")
		case !h.upgradeAllowed(up):
			refused = probUpgradeRefused.with("Upgrade: " + up + " is not among the protocols forwarded (pass_through_upgrades)")
		}
	}
	if rt == nil {
		if refused.Status != 0 {
			h.problems.write(w, refused, r.Header.Get(requestIDHeader), nil)
			return
		}
		h.passThrough(w, r, trusted)
		return
	}
	x := &exchange{
		h:         h,
		p:         h.p,
		rt:        rt,
		requestID: h.requestID(r),
		start:     time.Now(),
		fwd:       h.forwarder(trusted),
		w:         w,
		r:         r,
		path:      path,
		trusted:   trusted,
	}
	if h.tracing != nil {
		x.startTrace()
	}
	defer x.bufs.giveBack(&h.p.buffers) // runs last: nothing of x reads its buffers after it
	// Deferred so that a client disconnect, which aborts the handler with
	// http.ErrAbortHandler while the response is copied, is still counted.
	defer x.finish()
	if refused.Status != 0 {
		x.respond(refuse(outcomeRejected, refused))
		return
	}
	x.serve()
}

// requestID returns the client's X-Request-Id when it is a reasonable
// token, or a new random one, and sets it on r so the upstream sees it.
func (h *Handler) requestID(r *http.Request) string {
	if id := r.Header.Get(requestIDHeader); id != "" && len(id) <= 128 && visibleASCII(id) {
		return id
	}
	id := newRequestID(h.p.rand)
	r.Header.Set(requestIDHeader, id)
	return id
}

// upgradeAllowed reports whether a pass-through request may switch to
// proto.
func (h *Handler) upgradeAllowed(proto string) bool {
	for _, p := range h.passUpgrades {
		if strings.EqualFold(p, proto) {
			return true
		}
	}
	return false
}

// serve runs steps 2 to 8 of the request flow (route match is done): the
// route's admission (admitClient: the forwarded identity and the key; or
// admitDelivery: a webhook delivery's signature), which reads the body,
// then one tail: fingerprint the request, claim the key and either own
// the request or answer from the record already there. What a step
// decides is written once, by respond.
func (x *exchange) serve() {
	x.respond(x.decide())
}

// decide is serve's steps: the reply they decided, nil when the owner
// answered with the upstream's.
func (x *exchange) decide() *reply {
	// The route's admission: a webhook delivery's signature, or the
	// client's identity and key. It is the exchange's, the HTTP front's
	// (the route holds none): another front admits its own way.
	admit := x.admitClient
	if x.rt.settings.Webhook != nil {
		admit = x.admitDelivery
	}
	in, rep := admit()
	if rep != nil {
		return rep
	}
	fingerprinted := in.body
	if x.rt.grpc {
		fingerprinted = in.message
	}
	fp := x.rt.fp.sum(x.r.Method, x.path, x.r.URL.RawQuery, x.r.Header, fingerprinted)
	x.a = x.front().newAttempt(in.as)
	if len(in.legacy) > 0 {
		if rep := x.a.useLegacyKey(in.legacy); rep != nil {
			return rep
		}
	}
	rec := x.a.newClaim(fp)
	held, rep := x.a.ownOrAnswer(rec, in.body, x.authorize)
	if held == nil {
		return rep
	}
	defer held.slot.give()
	x.own(held, in.body)
	return nil
}

// admitClient is the admission of a route whose principals come from
// identity (header, JWT or XFCC): the key, the principal, the body, a key
// in the body, and a first-sent time; or the reply that refused it.
func (x *exchange) admitClient() (admitted, *reply) {
	key, rep := x.admit()
	if rep != nil {
		return admitted{}, rep
	}
	body, rep := x.readBody()
	if rep != nil {
		return admitted{}, rep
	}
	in := admitted{body: body}
	if x.rt.grpc {
		if in.message, rep = x.grpcCall(body); rep != nil {
			return admitted{}, rep
		}
		if x.rt.settings.GRPCKeyField > 0 {
			if key, rep = x.keyInBody(key, body, in.message); rep != nil {
				return admitted{}, rep
			}
		}
	} else if x.rt.keyPointer != nil {
		if key, rep = x.keyInBody(key, body, body); rep != nil {
			return admitted{}, rep
		}
	}
	in.as = admittedAs{principal: x.bufs.holder, key: key}
	if rep := x.readFirstSent(&in.as); rep != nil {
		return admitted{}, rep
	}
	return in, nil
}

// finish counts and logs the request once.
func (x *exchange) finish() {
	if x.timedOut.Load() {
		return // recorded when the client was answered (answeredTimeout)
	}
	if x.res.outcome == "" {
		x.note(result{outcome: outcomeRejected}) // aborted before an answer was chosen
	}
	res := x.res
	defer x.endTrace()
	total := time.Since(x.start)
	x.h.metrics.requests.WithLabelValues(x.rt.name, res.outcome).Inc()
	if x.rt.settings.Webhook != nil {
		x.h.metrics.webhooks.WithLabelValues(x.rt.name, x.webhookOutcome()).Inc()
	}
	x.h.metrics.added.WithLabelValues(x.rt.name).Observe((total - res.upstream).Seconds())
	level := slog.LevelInfo
	switch res.outcome {
	case outcomeStoreError, outcomeFenceLost, outcomeRecordUnreadable:
		level = slog.LevelError
	case outcomeStoreUnavailable:
		level = slog.LevelWarn
	}
	if !x.log().Enabled(context.Background(), level) {
		return // log_level above this line's: skip building it
	}
	line := requestLine{
		route: x.rt.name, outcome: res.outcome, status: res.status, requestID: x.requestID,
		duration: total, upstream: res.upstream, original: res.original,
		late: res.late, detail: res.detail, traceID: x.traceID,
	}
	if x.a != nil { // refused or bypassed before it had a key: none is logged
		line.key = x.a.hashedKey
	}
	line.log(x.h.log, level)
}
