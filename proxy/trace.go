package proxy

import (
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/claim"
)

// Tracing. With a TracerProvider (Options), every protected request is a
// server span, its parent taken from the client's traceparent; each store
// operation and the upstream call are client spans under it, and the
// upstream gets a traceparent naming its call. The attempt that claims a
// key stores its span context in the record, so that a replay, a 409 or a
// 422 for that key links to the execution: a retry's trace points at the
// trace that charged. Spans carry the route, the outcome, whether the
// answer was replayed and the hashed key, never the raw key, the
// principal or a body. Without a provider none of this runs.

const tracerName = "github.com/idemproxy/idemproxy/proxy"

// tracing is a Handler's tracer and propagator; nil when tracing is off.
type tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

func newTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) *tracing {
	if tp == nil {
		return nil
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return &tracing{tracer: tp.Tracer(tracerName), propagator: prop}
}

// startTrace starts the exchange's server span, continuing the client's
// trace, and carries it in x.r's context.
func (x *exchange) startTrace() {
	t := x.h.tracing
	ctx := t.propagator.Extract(x.r.Context(), propagation.HeaderCarrier(x.r.Header))
	ctx, x.span = t.tracer.Start(ctx, "idempotent "+x.rt.name,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(x.start),
		trace.WithAttributes(
			attribute.String("http.request.method", x.r.Method),
			attribute.String("url.path", x.path),
			attribute.String("idemproxy.route", x.rt.name),
		))
	x.r = x.r.WithContext(ctx)
}

// endTrace ends the server span with the exchange's outcome.
func (x *exchange) endTrace() {
	if x.span == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("idemproxy.outcome", x.outcome),
		attribute.Bool("idemproxy.replayed", x.outcome == outcomeReplayed),
		attribute.Int("http.response.status_code", x.status),
	}
	if x.hashedKey != "" {
		attrs = append(attrs, attribute.String("idemproxy.key", x.hashedKey))
	}
	if x.original != "" {
		attrs = append(attrs, attribute.String("idemproxy.original_request_id", x.original))
	}
	x.span.SetAttributes(attrs...)
	if x.status >= 500 || x.outcome == outcomeStoreError || x.outcome == outcomeFenceLost || x.outcome == outcomeStoreUnavailable || x.outcome == outcomeRecordUnreadable {
		x.span.SetStatus(codes.Error, x.outcome)
	}
	x.span.End()
}

// traceContext is what a record stores of the exchange's span: nothing
// when it is not traced.
func (x *exchange) traceContext() claim.TraceContext {
	if x.span == nil {
		return claim.TraceContext{}
	}
	sc := x.span.SpanContext()
	if !sc.IsValid() {
		return claim.TraceContext{}
	}
	return claim.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID()}
}

// linkTo links the exchange's span to the span of the attempt that
// claimed rec: the execution a replay, a 409 or a 422 refers to.
func (x *exchange) linkTo(rec *claim.Record) {
	if x.span == nil || rec.Trace.IsZero() {
		return
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    rec.Trace.TraceID,
		SpanID:     rec.Trace.SpanID,
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
	x.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
		attribute.String("idemproxy.link", "execution"),
		attribute.String("idemproxy.original_request_id", rec.RequestID),
	}})
}

// storeSpan records store operation op, which started at start and ended
// now, as a client span.
func (x *exchange) storeSpan(op string, start time.Time) {
	if x.span == nil {
		return
	}
	_, sp := x.h.tracing.tracer.Start(x.r.Context(), "redis "+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithAttributes(
			attribute.String("db.system.name", "redis"),
			attribute.String("db.operation.name", op),
		))
	sp.End()
}

// upstreamSpan starts the client span of an upstream call and puts its
// traceparent on req, which is the outgoing request ReverseProxy built.
func (x *exchange) upstreamSpan(req *http.Request) (*http.Request, trace.Span) {
	ctx, sp := x.h.tracing.tracer.Start(req.Context(), "upstream "+req.Method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", req.Method),
			attribute.String("server.address", req.URL.Host),
		))
	x.h.tracing.propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req.WithContext(ctx), sp
}

// endUpstreamSpan ends an upstream call's span.
func endUpstreamSpan(sp trace.Span, resp *http.Response, err error) {
	switch {
	case err != nil:
		sp.SetStatus(codes.Error, err.Error())
	default:
		sp.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			sp.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
		}
	}
	sp.End()
}
