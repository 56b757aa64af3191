package proxy

import (
	"net/http"
	"strings"

	"github.com/idemproxy/idemproxy/claim"
)

// respond writes the reply a step decided, in one place: a problem, a
// stored record (replayed, or followed while it streams), or the request
// forwarded unprotected.

// respond writes rep, the answer a step decided, and notes what finish
// counts and logs of it. A nil rep was answered already (the owner's
// forward).
func (x *exchange) respond(rep *reply) {
	if rep == nil {
		return
	}
	if rep.record != nil && rep.record.BodyCompressed && !rep.stream {
		// A stored body is inflated for its replay here, into a buffer
		// the exchange holds until it is written (inflate).
		if failed := x.inflate(rep.record); failed != nil {
			rep = failed
		}
	}
	x.note(result{outcome: rep.outcome, detail: rep.detail})
	if x.repeatable() {
		if v := repeatabilityOf(rep); v != "" {
			x.w.Header().Set(repeatabilityResult, v)
		}
	}
	switch {
	case rep.gone:
	case rep.bypass:
		x.note(result{status: x.bypass(rep.body)})
	case rep.record != nil:
		if rep.replayed {
			x.note(result{original: rep.record.RequestID})
		}
		if rep.stream {
			res, aborted := x.follow(rep.record)
			x.note(res)
			if aborted {
				// The protocol's own abnormal end: the chunked body is
				// closed without its last chunk.
				panic(http.ErrAbortHandler)
			}
			return
		}
		x.note(x.writeRecord(rep.record, rep.replayed))
	default:
		x.note(result{fallback: rep.problem.Detail, status: rep.problem.Status})
		writeFramed(x.w, x.rt.front.frame(rep.problem, x.requestID))
	}
}

// writeRecord writes a completed record's response, marked as a replay
// when replayed, and returns its status (and why, if the client was cut).
func (x *exchange) writeRecord(rec *claim.Record, replayed bool) result {
	h := x.w.Header()
	trailers := false
	for k, vs := range rec.Header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			trailers = true // set once the body is written
			continue
		}
		h[k] = vs
	}
	if replayed {
		h.Set(replayedHeader, "true")
		if x.rt.settings.AdvertiseRetention {
			h.Set(retentionHeader, retentionSeconds(x.rt.settings.Retention))
		}
	}
	x.w.WriteHeader(rec.Status)
	// Every answer written from the store, whatever its size, within
	// client.write_timeout: a client with a tiny receive window holds the
	// socket's buffers full, and a write without a deadline would hold the
	// handler and the answer for as long as the client likes.
	if err := x.writeAnswer(http.NewResponseController(x.w), rec.Body); err != nil {
		return result{status: rec.Status, detail: detailCut}
	}
	if trailers { // a gRPC answer's status and trailing metadata, as stored
		for k, vs := range rec.Header {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				h[k] = vs
			}
		}
	}
	return result{status: rec.Status}
}

// bypass forwards the request without protection, and returns the
// status answered. body, when not nil, is the already-read request body.
func (x *exchange) bypass(body []byte) int {
	r := x.r.WithContext(x.r.Context()) // a copy; ReverseProxy clones it again
	r.Trailer = nil                     // request trailers never reach the upstream of a protected route
	if body != nil {
		r.Body = x.bufs.lend(body)
		r.ContentLength = int64(len(body))
	}
	sw := &statusWriter{ResponseWriter: x.w}
	x.fwd.protected.ServeHTTP(sw, r)
	return sw.status
}
