package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// The owner's answer: ReverseProxy's hooks on a claimed request
// (modifyResponse, errorHandler) store the upstream's answer before the
// client gets any of it, and settle a failure by the route's
// unknown_outcome.

// noteSettled notes, as the request's outcome, the reply the claim was
// settled with: at once, as the settlement happens, before anything
// reaches the client.
func (o *owner) noteSettled() {
	if v := o.held.settled(); v != nil {
		o.x.note(result{outcome: v.outcome, detail: v.detail})
	}
}

// modifyResponse settles a protected request once the upstream answered,
// before ReverseProxy writes anything to the client.
func (h *Handler) modifyResponse(resp *http.Response) error {
	o := ownerFrom(resp.Request.Context())
	if o == nil {
		return nil
	}
	x := o.x
	dropOwnHeaders(resp.Header)
	o.upstream = time.Since(o.sent)
	h.metrics.upstream.WithLabelValues(x.rt.name).Observe(o.upstream.Seconds())
	o.status = resp.StatusCode
	if x.rt.releaseOn[resp.StatusCode] {
		o.held.release(fmt.Sprintf("upstream answered %d, which is in release_on", resp.StatusCode))
		o.noteSettled()
		return nil
	}
	if x.repeatable() {
		defer resp.Header.Set(repeatabilityResult, "accepted") // executed; after the head is stored, never stored itself
	}
	if h.p.streams && x.rt.settings.Stream && isStream(resp) && o.startStream(resp) {
		return nil
	}
	return o.storeAnswer(resp)
}

// storeAnswer reads the upstream's answer (resp, not a stream) up to the
// route's max_response_body and settles the key with it: whole, or with
// its body omitted when the answer is larger (then the client still gets
// all of it). The client's copy reads the buffer, lent.
func (o *owner) storeAnswer(resp *http.Response) error {
	x, h := o.x, o.x.h
	limit := x.rt.settings.MaxResponseBody
	expected := resp.ContentLength
	if expected > limit {
		expected = limit + 1
	}
	force := func(n int) error { h.p.buffers.force(x.bufs.holder, n); return nil }
	give := func(n int) { h.p.buffers.give(x.bufs.holder, n) }
	buf, err := readAll(io.LimitReader(resp.Body, limit+1), expected, force, give)
	x.bufs.respBuf = buf
	if err != nil {
		// The upstream answered, so it may have acted, but the body broke
		// off: there is nothing whole to store. errorHandler applies
		// unknown_outcome.
		return fmt.Errorf("read upstream response body: %w", err)
	}
	header := storedHeader(x.rt, resp.Header)
	if x.rt.grpc {
		// The body was read to its end: the trailers are in.
		if code := grpcStatus(resp.Header, resp.Trailer); code >= 0 && code < len(x.rt.grpcRelease) && x.rt.grpcRelease[code] {
			resp.Body.Close()
			resp.Body = x.bufs.lend(buf)
			o.held.release(fmt.Sprintf("upstream answered gRPC status %d, which is in grpc.release_codes", code))
			o.noteSettled()
			return nil
		}
		header = withTrailers(header, resp.Trailer)
	}
	rec := settledRecord(o.held.rec, o.held.rec.Token, claim.Completed, resp.StatusCode, header, x.p.now())
	if x.rt.settings.AdvertiseRetention {
		resp.Header.Set(retentionHeader, retentionSeconds(x.rt.settings.Retention))
	}
	// max_response_body caps the whole stored response, headers included:
	// an upstream answering with megabytes of headers cannot fill Redis.
	switch size := int64(len(buf)) + headerSize(rec.Header); {
	case int64(len(buf)) > limit:
		rec.BodyOmitted, rec.Header = true, nil
		resp.Body = readCloser{io.MultiReader(x.bufs.lend(buf), resp.Body), resp.Body}
	case size > limit:
		rec.BodyOmitted, rec.Header = true, nil
		resp.Body.Close()
		resp.Body = x.bufs.lend(buf)
	default:
		rec.Body = buf
		resp.Body.Close()
		resp.Body = x.bufs.lend(buf)
	}
	o.held.complete(rec)
	o.noteSettled()
	return nil
}

// errorHandler answers when the upstream gave no usable response. For a
// protected request, whether the upstream may have acted decides the claim.
func (h *Handler) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	o := ownerFrom(r.Context())
	if o == nil { // bypassed: no claim to settle
		h.passThroughError(w, r, err)
		return
	}
	o.x.respond(o.failed(r, err))
}

// failed settles the claim of a request the upstream gave no usable
// answer to (holding.fail, told whether the request was written and
// whether it ran out of time), and is the reply its client gets.
func (o *owner) failed(r *http.Request, err error) *reply {
	if o.upstream == 0 {
		o.upstream = time.Since(o.sent)
	}
	sent := o.wrote.Load() && !errors.Is(err, errNeverSeen)
	if cause := context.Cause(r.Context()); sent && cause != nil && cause != r.Context().Err() {
		err = fmt.Errorf("%w (%w)", cause, err)
	}
	timedOut := isTimeout(err) || errors.Is(err, errLateCap) || errors.Is(err, errAbandoned)
	rep := o.held.fail(sent, timedOut, err)
	o.unknown = rep.unknown
	o.noteSettled()
	return rep
}
