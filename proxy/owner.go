package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Store-write retry after the upstream answered: the dual-write window.
// The client is answered either way; these bound how long it waits.
var storeRetryWaits = []time.Duration{0, 25 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// settleTimeout bounds each settle operation (complete, release, keep).
const settleTimeout = 2 * time.Second

// owner is the state of a request that holds the claim, shared between
// the exchange and the ReverseProxy hooks through the request context.
type owner struct {
	x    *exchange
	rec  *claim.Record
	body []byte
	// wrote is set once request bytes may have reached the upstream (its
	// headers were written), for the current attempt.
	wrote atomic.Bool
	// sent is when the request was forwarded, for the upstream histogram.
	sent time.Time
	// gate carries the answer to the client; the late-answer timer may
	// close it.
	gate *gate
	// cancel ends the upstream call with a cause: the late-call cap, or a
	// drain that ran out of time.
	cancel context.CancelCauseFunc
	// late is set once the client was answered 504 and the upstream call
	// went on past upstream.timeout, holding one of the late-call slots.
	late atomic.Bool

	// mu guards settled and serialises renewals with settling, so a
	// renewal never runs after the record was completed or released.
	mu      sync.Mutex
	settled bool
	renewer *time.Timer
}

type ownerKey struct{}

func ownerFrom(ctx context.Context) *owner {
	o, _ := ctx.Value(ownerKey{}).(*owner)
	return o
}

// Causes that end an owner's upstream call early; errorHandler names them.
var (
	errLateCap    = errors.New("upstream.max_late_calls reached: cancelled at upstream.timeout")
	errLateWindow = errors.New("no answer within upstream.timeout + upstream.late_answer_window")
	errAbandoned  = errors.New("drain.timeout ran out at shutdown: cancelled")
)

// own forwards the request as the claim's owner and settles the claim.
func (x *exchange) own(rec *claim.Record, body []byte) {
	h := x.h
	g := newGate(x.w)
	x.w = g // every answer of the owner goes through the gate
	defer g.seal()
	o := &owner{x: x, rec: rec, body: body, gate: g}
	lease := x.rt.settings.Lease
	o.renewer = time.AfterFunc(lease/3, o.renew)
	defer o.settle(func() {}) // stops renewal if nothing settled (a panic)

	// The upstream call is detached from the client: if the client hangs
	// up, the upstream still finishes and its answer is stored, so the
	// client's retry gets a replay instead of a second execution. It may
	// run past upstream.timeout, which bounds only the client's wait, for
	// upstream.late_answer_window more.
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(x.r.Context()))
	defer cancel(nil)
	o.cancel = cancel
	budget, cause := h.upstreamTimeout, error(nil)
	if h.lateWindow > 0 {
		budget, cause = h.upstreamTimeout+h.lateWindow, errLateWindow
		client := time.AfterFunc(h.upstreamTimeout, o.clientTimedOut)
		defer client.Stop()
	}
	ctx, stop := context.WithTimeoutCause(ctx, budget, cause)
	defer stop()
	h.metrics.claims.add(o)
	defer h.metrics.claims.remove(o)
	if h.abandoned.Load() {
		cancel(errAbandoned) // a drain gave up before this call began
	}
	ctx = context.WithValue(ctx, ownerKey{}, o)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { o.wrote.Store(true) },
	})
	// A shallow copy is enough: ReverseProxy deep-clones it for the
	// outbound request.
	out := x.r.WithContext(ctx)
	out.Body = x.lend(body)
	out.ContentLength = int64(len(body))
	o.sent = time.Now()
	x.fwd.protected.ServeHTTP(g, out)
	status, closed := g.seal()
	if x.status == 0 || status != 0 {
		x.status = status
	}
	if closed {
		x.status = http.StatusGatewayTimeout
	}
	if o.late.Load() {
		h.lateCalls.Add(-1)
		h.metrics.lateCalls.Dec()
		o.lateSettled()
	}
}

// clientTimedOut runs at upstream.timeout, on the timer's goroutine, while
// the upstream call goes on. It answers the client 504 and keeps the call
// running for its late answer, when a late-call slot is free; otherwise it
// cancels the call, whose outcome is then unknown.
func (o *owner) clientTimedOut() {
	x, h := o.x, o.x.h
	if h.lateCalls.Add(1) > h.maxLate {
		h.lateCalls.Add(-1)
		o.cancel(errLateCap)
		return
	}
	p := probUpstreamTimeout.with(fmt.Sprintf("no answer within %s; the request is still running upstream and its answer will be stored: retry with the same key to get it", h.upstreamTimeout))
	p.retryAfter = x.rt.settings.Lease
	answered := o.gate.close(func(w http.ResponseWriter) {
		o.late.Store(true) // under the gate's lock: seal sees it
		h.metrics.lateCalls.Inc()
		w.Header().Set("Connection", "close") // this handler stays busy
		writeProblem(w, p, x.requestID)
	})
	if !answered { // the answer is already on its way
		h.lateCalls.Add(-1)
	}
}

// Results of a late call, the values of the result label of
// idemproxy_late_answers_total.
const (
	lateStored    = "stored"    // the late answer was stored for the retries
	lateReleased  = "released"  // the late answer was transient: key released
	lateAbandoned = "abandoned" // no answer: window, cap or drain ran out, or the call broke
	lateUnstored  = "unstored"  // answered, but the store refused or failed (fence_lost, store_error)
)

var lateResults = []string{lateStored, lateReleased, lateAbandoned, lateUnstored}

// lateSettled counts and logs how a late call ended.
func (o *owner) lateSettled() {
	x := o.x
	result := lateAbandoned
	switch {
	case x.outcome == outcomeStored && x.unknown == "":
		result = lateStored
	case x.outcome == outcomeReleased && x.unknown == "":
		result = lateReleased
	case (x.outcome == outcomeStoreError || x.outcome == outcomeFenceLost) && x.unknown == "":
		result = lateUnstored
	}
	x.late = true
	x.h.metrics.lateAnswers.WithLabelValues(x.rt.name, result).Inc()
	level := slog.LevelInfo
	if result != lateStored && result != lateReleased {
		level = slog.LevelWarn
	}
	x.h.log.Log(context.Background(), level, "late answer", "route", x.rt.name, "result", result,
		"key", x.hashedKey, "request_id", x.requestID, "upstream", time.Since(o.sent), "outcome", x.outcome)
}

// renew extends the lease every lease/3 while the upstream runs.
func (o *owner) renew() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.settled {
		return
	}
	x := o.x
	lease := x.rt.settings.Lease
	ctx, cancel := context.WithTimeout(context.Background(), lease/3)
	defer cancel()
	start := time.Now()
	err := x.h.store.Renew(ctx, x.hashedKey, o.rec, lease)
	x.h.observeStore("renew", start)
	switch {
	case err == nil:
		x.h.metrics.renewals.WithLabelValues("ok").Inc()
	case errors.Is(err, claim.ErrLeaseLost):
		// Keep forwarding: the upstream call is under way and cannot be
		// taken back. Completion is fenced and will say what happened.
		x.h.metrics.renewals.WithLabelValues("lost").Inc()
		x.h.log.Error("lease lost while the upstream runs", "route", x.rt.name, "key", x.hashedKey, "request_id", x.requestID)
		return
	default:
		x.h.metrics.renewals.WithLabelValues("error").Inc()
		x.h.metrics.storeErrors.WithLabelValues("renew").Inc()
		x.h.log.Warn("lease renewal failed", "route", x.rt.name, "key", x.hashedKey, "request_id", x.requestID, "err", err)
	}
	o.renewer.Reset(lease / 3)
}

// settle stops renewals and runs f once, before anything reaches the
// client. Later calls do nothing.
func (o *owner) settle(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.settled {
		return
	}
	o.settled = true
	o.renewer.Stop()
	f()
}

// settleCtx is detached from the client and bounded.
func settleCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), settleTimeout)
}

// release frees the key so a retry executes, and sets the outcome.
func (o *owner) release(why string) {
	x := o.x
	ctx, cancel := settleCtx()
	defer cancel()
	start := time.Now()
	err := x.h.store.Release(ctx, x.hashedKey, o.rec.Token)
	x.h.observeStore("release", start)
	x.outcome, x.detail = outcomeReleased, why
	switch {
	case errors.Is(err, claim.ErrLeaseLost):
		x.outcome = outcomeFenceLost
		x.detail = why + "; the key was already held by another owner, left alone"
	case err != nil:
		// The claim lapses by itself after the lease; until then retries
		// get 409. Nothing executed twice.
		x.h.metrics.storeErrors.WithLabelValues("release").Inc()
		x.detail = why + "; release failed, the claim lapses after its lease: " + err.Error()
	}
}

// keep holds the claim for one more full lease after an unknown outcome, so
// a retry does not execute while the first attempt may still be landing.
func (o *owner) keep(why string) {
	x := o.x
	ctx, cancel := settleCtx()
	defer cancel()
	start := time.Now()
	err := x.h.store.Renew(ctx, x.hashedKey, o.rec, x.rt.settings.Lease)
	x.h.observeStore("renew", start)
	x.outcome, x.detail = outcomeClaimed, why+"; claim kept for one lease"
	if err != nil && !errors.Is(err, claim.ErrLeaseLost) {
		x.h.metrics.storeErrors.WithLabelValues("renew").Inc()
	}
}

// complete stores the settled response, retrying briefly. A failure here
// is the dual-write window: the upstream acted and the outcome is not
// stored. It is counted and logged, and the client is answered anyway.
func (o *owner) complete(rec *claim.Record) {
	x := o.x
	retention := x.rt.settings.Retention
	var err error
	for _, wait := range storeRetryWaits {
		time.Sleep(wait)
		ctx, cancel := settleCtx()
		start := time.Now()
		var how claim.Completion
		how, err = x.h.store.Complete(ctx, x.hashedKey, rec, retention)
		x.h.observeStore("complete", start)
		cancel()
		if err == nil {
			x.outcome = outcomeStored
			x.h.metrics.storedBytes.Observe(float64(len(rec.Body)))
			if how == claim.StoredAfterLapse {
				x.detail = "stored after the lease had lapsed; nobody had claimed the key since"
			}
			return
		}
		if errors.Is(err, claim.ErrLeaseLost) || errors.Is(err, claim.ErrCorrupt) {
			break
		}
		x.h.metrics.storeErrors.WithLabelValues("complete").Inc()
	}
	if errors.Is(err, claim.ErrLeaseLost) {
		x.outcome = outcomeFenceLost
		x.detail = "the lease lapsed and another attempt holds the key; its record was not overwritten"
		return
	}
	x.outcome = outcomeStoreError
	x.detail = "upstream answered but the response could not be stored (dual-write window): " + err.Error()
}

// rewrite directs every request to the upstream. It runs inside
// ReverseProxy for protected and pass-through requests alike.
func (h *Handler) rewrite(pr *httputil.ProxyRequest, trustedPeer bool) {
	if trustedPeer {
		// A trusted mesh proxy's X-Forwarded-For is the real client chain.
		pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	}
	pr.SetURL(h.upstream)
	pr.SetXForwarded()
	pr.Out.Host = pr.In.Host
	// Never let the Transport resend a request on its own: it treats a
	// body-less request carrying Idempotency-Key as replayable, and resends
	// it when a reused connection dies after the upstream acted. A non-nil
	// body that is not http.NoBody, and no GetBody, make it unreplayable.
	pr.Out.GetBody = nil
	if pr.Out.Body == nil || pr.Out.Body == http.NoBody {
		switch pr.Out.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		default:
			pr.Out.Body = emptyBody{}
		}
	}
}

// emptyBody is an empty request body that http.Transport cannot replay.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }

// modifyResponse settles a protected request once the upstream answered,
// before ReverseProxy writes anything to the client.
func (h *Handler) modifyResponse(resp *http.Response) error {
	o := ownerFrom(resp.Request.Context())
	if o == nil {
		return nil
	}
	x := o.x
	x.upstream = time.Since(o.sent)
	h.metrics.upstream.WithLabelValues(x.rt.name).Observe(x.upstream.Seconds())
	x.status = resp.StatusCode
	if x.rt.releaseOn[resp.StatusCode] {
		o.settle(func() { o.release(fmt.Sprintf("upstream answered %d, which is in release_on", resp.StatusCode)) })
		return nil
	}
	limit := x.rt.settings.MaxResponseBody
	expected := resp.ContentLength
	if expected > limit {
		expected = limit + 1
	}
	buf, err := readAll(io.LimitReader(resp.Body, limit+1), expected)
	x.respBuf = buf
	if err != nil {
		// The upstream answered, so it may have acted, but the body broke
		// off: there is nothing whole to store. errorHandler applies
		// unknown_outcome.
		return fmt.Errorf("read upstream response body: %w", err)
	}
	rec := &claim.Record{
		State:       claim.Completed,
		Token:       o.rec.Token,
		Fingerprint: o.rec.Fingerprint,
		Created:     o.rec.Created,
		Completed:   time.Now(),
		RequestID:   o.rec.RequestID,
		Status:      resp.StatusCode,
		Header:      resp.Header.Clone(),
	}
	if int64(len(buf)) > limit {
		rec.BodyOmitted = true
		resp.Body = readCloser{io.MultiReader(x.lend(buf), resp.Body), resp.Body}
	} else {
		rec.Body = buf
		resp.Body.Close()
		resp.Body = x.lend(buf)
	}
	o.settle(func() { o.complete(rec) })
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// passThroughError answers an unprotected request the upstream gave no
// usable response to.
func (h *Handler) passThroughError(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Warn("upstream error on pass-through request", "method", r.Method, "err", err)
	writeProblem(w, probUpstreamDown.with("the upstream could not be reached"), r.Header.Get(RequestIDHeader))
}

// errorHandler answers when the upstream gave no usable response. For a
// protected request, whether the upstream may have acted decides the claim.
func (h *Handler) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	o := ownerFrom(r.Context())
	if o == nil { // bypassed: no claim to settle
		h.passThroughError(w, r, err)
		return
	}
	x := o.x
	if x.upstream == 0 {
		x.upstream = time.Since(o.sent)
	}
	if !o.wrote.Load() {
		o.settle(func() { o.release("upstream unreachable, request never sent: " + err.Error()) })
		x.problem(probUpstreamDown.with("the request was not sent to the upstream; it is safe to retry"))
		return
	}
	if cause := context.Cause(r.Context()); cause != nil && cause != r.Context().Err() {
		err = fmt.Errorf("%w (%w)", cause, err)
	}
	x.unknown = "outcome unknown: " + err.Error()
	timeout := isTimeout(err) || errors.Is(err, errLateCap) || errors.Is(err, errAbandoned)
	policy := x.rt.settings.Unknown
	h.metrics.unknownOutcomes.WithLabelValues(x.rt.name, policy.String()).Inc()
	switch policy {
	case Fail:
		rec := outcomeUnknownRecord(o.rec, o.rec.Token, time.Now(), timeout)
		o.settle(func() {
			o.complete(rec)
			if x.outcome == outcomeStored {
				x.detail = x.unknown + "; stored as 502 outcome-unknown, replayed to every retry"
			}
		})
		x.writeRecord(rec, false)
		return
	case Release:
		o.settle(func() { o.release(x.unknown) })
	default:
		o.settle(func() { o.keep(x.unknown) })
	}
	p := probUpstreamFailed.with("the upstream may have acted; retry later to learn the outcome")
	if timeout {
		p = probUpstreamTimeout.with(fmt.Sprintf("no answer within %s; the upstream may have acted", h.upstreamTimeout))
	}
	x.problem(p)
}

// outcomeUnknownRecord is the completed record that settles a key whose
// request may or may not have been executed (unknown_outcome: fail): a
// 502 outcome-unknown problem, replayed to every retry, so nothing
// executes again. orig is the claim it settles, token the writer's.
func outcomeUnknownRecord(orig *claim.Record, token claim.Token, now time.Time, timeout bool) *claim.Record {
	what := "the connection to the upstream broke after the request was sent"
	if timeout {
		what = "the upstream did not answer in time"
	}
	p := probOutcomeUnknown.with(what + "; it may have acted on the request. It will not be executed again with this idempotency key: check the state of the resource, and to try again send a new key")
	body := problemBody(p, orig.RequestID)
	return &claim.Record{
		State:       claim.Completed,
		Token:       token,
		Fingerprint: orig.Fingerprint,
		Created:     orig.Created,
		Completed:   now,
		RequestID:   orig.RequestID,
		Status:      p.Status,
		Header: http.Header{
			"Content-Type":  {problemContentType},
			"Cache-Control": {"no-store"},
		},
		Body: body,
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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
	resp, err := t.next.RoundTrip(req)
	if err == nil || o == nil || o.wrote.Load() || req.Context().Err() != nil {
		return resp, err
	}
	retry := req.Clone(req.Context())
	if len(o.body) == 0 {
		retry.Body = emptyBody{}
	} else {
		retry.Body = o.x.lend(o.body)
	}
	return t.next.RoundTrip(retry)
}
