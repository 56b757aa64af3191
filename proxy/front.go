package proxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// What a front hands the protocol: the request's front (protocol, route,
// request id, start, trace), known from its first byte, and the attempt
// built whole on it once the request is admitted.

// attempt is the protocol on one key: who presents it on which route,
// where it lives in the store, and the claim this attempt holds. Claiming,
// answering from a record already there, waiting, settling an orphan and
// reconciling live on it and return the reply they decided; it knows no
// HTTP request. It is built whole from a front once the request is
// admitted (newAttempt), and holds the protocol it runs on (p) as a
// field: an HTTP request's exchange runs one (and writes its reply); the
// key API's reconcile-now runs one with no request at all.
type attempt struct {
	p  *protocol
	rt *route
	// ctx is what the attempt's store calls and lookups inherit: values
	// (the trace), never the front's cancellation, which the attempt asks
	// about itself (storeFailed).
	ctx       context.Context
	requestID string
	start     time.Time
	// trace is the front's span as a record stores it, and traceID its
	// trace id (logged on every line); zero when not traced. seen, when
	// set, hears what the attempt did, for the front's trace.
	trace   claim.TraceContext
	traceID string
	seen    traceSink

	principal string
	// hashedKey is the store key, the only form of the key that is logged.
	hashedKey string
	// idemKey is the idempotency key as the client sent it: never logged,
	// only sent to the upstream (a reconcile lookup).
	idemKey string
	// claimedAt is when the current claim was sent, on this process'
	// monotonic clock (its record's Created is the same moment on the wall
	// clock, for other processes); forwardBy is when the claim stops being
	// one its owner may act on (claim.ConfirmWindow after it was sent):
	// nothing is forwarded after it.
	claimedAt, forwardBy time.Time
	// firstSent is when the request was first sent, when hasFirstSent
	// (firstsent.go).
	firstSent    time.Time
	hasFirstSent bool
}

// front is what a front knows of a request before the protocol on its
// key starts: the protocol and route, the request's id and start, and its
// trace. An attempt is built on it once the request is admitted
// (newAttempt), whole, and never written after.
type front struct {
	p         *protocol
	rt        *route
	ctx       context.Context
	requestID string
	start     time.Time
	trace     claim.TraceContext
	traceID   string
	seen      traceSink
}

// traceSink is what an attempt tells its front's trace: each store call,
// each reconcile lookup, and the records it answered from (an exchange;
// the key API has none).
type traceSink interface {
	storeSpan(op string, start time.Time, err error)
	lookupSpan(start time.Time, ans lookupAnswer)
	linkTo(rec *claim.Record)
}

// newFront is the front of a request on rt, from ctx, starting now.
func (p *protocol) newFront(ctx context.Context, rt *route, requestID string) front {
	return front{p: p, rt: rt, ctx: ctx, requestID: requestID, start: time.Now()}
}

// admittedAs is who presents the key and what they said of it, as
// admission found them.
type admittedAs struct {
	principal string
	// key is the idempotency key as the client sent it.
	key string
	// firstSent is when the request was first sent, when hasFirstSent.
	firstSent    time.Time
	hasFirstSent bool
}

// newAttempt is the attempt at in's key by in's principal, on f's route.
func (f front) newAttempt(in admittedAs) *attempt {
	return &attempt{
		p: f.p, rt: f.rt, ctx: f.ctx, requestID: f.requestID, start: f.start,
		trace: f.trace, traceID: f.traceID, seen: f.seen,
		principal: in.principal,
		hashedKey: f.p.codec.Key(in.principal, f.rt.scope, in.key),
		idemKey:   in.key, firstSent: in.firstSent, hasFirstSent: in.hasFirstSent,
	}
}

// log is the protocol's logger, with the trace id on every line when the
// request is traced.
func (a *attempt) log() *slog.Logger {
	if a.traceID != "" {
		return a.p.log.With("trace_id", a.traceID)
	}
	return a.p.log
}

// linkTo links the front's span to the span of the attempt that claimed
// rec (traceSink).
func (a *attempt) linkTo(rec *claim.Record) {
	if a.seen != nil {
		a.seen.linkTo(rec)
	}
}

// legacyKey is a key an earlier release stored a delivery under: read,
// and answered from, for one retention after the store first served the
// keys that replaced it (change).
type legacyKey struct {
	scope, key string
	change     int // keysV06, keysV07, keysV09
}
