package proxy

import (
	"net/http"
	"slices"
)

// OASIS Repeatable Requests 1.0: a request that carries
// Repeatability-Request-ID, on a route keyed by it (key_header:
// Repeatability-Request-ID), gets Repeatability-Result: accepted when it
// was executed or replayed (a reconciled answer too), and rejected when
// it was refused for its key or its repeatability headers.

// repeatabilityRejects are the problems that refuse a request for its key
// or its repeatability headers; they say rejected when their status is
// one the specification names (400, 409, 412, 422).
var repeatabilityRejects = []problem{probKeyMissing, probKeyMalformed, probMismatch, probInProgress, probNotReplayable, probKeyExpired, probRecordLost, probFirstSentInvalid}

// repeatable reports whether the request speaks Repeatable Requests.
func (x *exchange) repeatable() bool {
	return x.rt.keyHeader == repeatabilityID && x.r.Header.Get(repeatabilityID) != ""
}

// repeatabilityOf is what Repeatability-Result says of rep, "" nothing.
func repeatabilityOf(rep *reply) string {
	switch {
	case rep.record != nil:
		return "accepted"
	case rep.bypass || rep.gone:
		return ""
	}
	switch rep.problem.Status {
	case http.StatusBadRequest, http.StatusConflict, http.StatusPreconditionFailed, http.StatusUnprocessableEntity:
		if slices.ContainsFunc(repeatabilityRejects, func(p problem) bool { return p.Type == rep.problem.Type }) {
			return "rejected"
		}
	}
	return ""
}
