package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

// ProblemTypePrefix starts the type URI of every problem idemproxy answers
// with. The part after it is stable and listed in docs/configuration.md.
const ProblemTypePrefix = "urn:idemproxy:problem:"

// problem is an RFC 9457 problem detail. Status and Type are always set;
// the extension members are omitted when empty.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// OriginalStatus is the status of the stored response that could not
	// be replayed (response-not-replayable).
	OriginalStatus int `json:"original_status,omitempty"`
	// RequestID traces the response to its log line.
	RequestID string `json:"request_id,omitempty"`

	// retryAfter, when positive, is sent as Retry-After in whole seconds.
	retryAfter time.Duration
}

// The problems idemproxy answers with, one per case. Titles never change
// with the request; detail says what was wrong with this one.
var (
	probKeyMissing            = problem{Type: "key-missing", Status: http.StatusBadRequest, Title: "Idempotency key required"}
	probKeyMalformed          = problem{Type: "key-malformed", Status: http.StatusBadRequest, Title: "Malformed idempotency key"}
	probIdentityMissing       = problem{Type: "identity-missing", Status: http.StatusUnauthorized, Title: "Authenticated principal required"}
	probTokenInvalid          = problem{Type: "token-invalid", Status: http.StatusUnauthorized, Title: "Bearer token not valid"}
	probIdentityInvalid       = problem{Type: "identity-invalid", Status: http.StatusBadRequest, Title: "Ambiguous principal"}
	probHopByHop              = problem{Type: "hop-by-hop-forbidden", Status: http.StatusBadRequest, Title: "A header idemproxy relies on was nominated as hop-by-hop"}
	probPathNotCanonical      = problem{Type: "path-not-canonical", Status: http.StatusBadRequest, Title: "The request path is not in canonical form"}
	probBodyTooLarge          = problem{Type: "body-too-large", Status: http.StatusRequestEntityTooLarge, Title: "Request body too large"}
	probBodyUnreadable        = problem{Type: "body-unreadable", Status: http.StatusBadRequest, Title: "Request body could not be read"}
	probMismatch              = problem{Type: "key-reused", Status: http.StatusUnprocessableEntity, Title: "Idempotency key reused with a different request"}
	probInProgress            = problem{Type: "request-in-progress", Status: http.StatusConflict, Title: "A request with this idempotency key is in progress"}
	probNotReplayable         = problem{Type: "response-not-replayable", Status: http.StatusConflict, Title: "The original response was too large to store and cannot be replayed"}
	probOverloaded            = problem{Type: "overloaded", Status: http.StatusServiceUnavailable, Title: "The route forwards as many requests as it may"}
	probBuffersFull           = problem{Type: "buffers-full", Status: http.StatusServiceUnavailable, Title: "idemproxy holds as many request bytes as it may"}
	probTooManyKeys           = problem{Type: "too-many-keys", Status: http.StatusTooManyRequests, Title: "Too many new idempotency keys"}
	probTooManyBytes          = problem{Type: "too-many-bytes", Status: http.StatusTooManyRequests, Title: "This principal holds its whole share of request buffers"}
	probStoreFull             = problem{Type: "store-full", Status: http.StatusServiceUnavailable, Title: "Idempotency store full"}
	probStoreUnavailable      = problem{Type: "store-unavailable", Status: http.StatusServiceUnavailable, Title: "Idempotency store unavailable"}
	probRecordCorrupt         = problem{Type: "record-unreadable", Status: http.StatusInternalServerError, Title: "Stored idempotency record could not be read"}
	probUpstreamDown          = problem{Type: "upstream-unreachable", Status: http.StatusBadGateway, Title: "Upstream unreachable; the request was not sent"}
	probUpstreamFailed        = problem{Type: "upstream-failed", Status: http.StatusBadGateway, Title: "Upstream connection failed after the request was sent"}
	probUpstreamTimeout       = problem{Type: "upstream-timeout", Status: http.StatusGatewayTimeout, Title: "Upstream did not answer in time"}
	probReplayForbidden       = problem{Type: "replay-forbidden", Status: http.StatusForbidden, Title: "Not authorized to see the stored response"}
	probAuthorizerUnavailable = problem{Type: "authorizer-unavailable", Status: http.StatusServiceUnavailable, Title: "The replay authorizer is unavailable"}
	probUpgradeRefused        = problem{Type: "upgrade-refused", Status: http.StatusBadRequest, Title: "Protocol upgrade refused"}
	probSignatureInvalid      = problem{Type: "signature-invalid", Status: http.StatusUnauthorized, Title: "Webhook signature missing, wrong or outside the tolerance"}
	probFirstSentInvalid      = problem{Type: "first-sent-invalid", Status: http.StatusBadRequest, Title: "Malformed first-sent time"}
	probKeyExpired            = problem{Type: "key-expired", Status: http.StatusPreconditionFailed, Title: "The request was first sent longer ago than its record is kept"}
	probRecordLost            = problem{Type: "record-lost", Status: http.StatusPreconditionFailed, Title: "The request was first sent before the store lost its records"}
	probOutcomeUnknown        = problem{Type: "outcome-unknown", Status: http.StatusBadGateway, Title: "The outcome of the request sent with this idempotency key is unknown"}
)

// problems lists every problem above: the docs/configuration.md's table of problem types
// must name each (TestReadmeListsEveryProblemType). A new problem is
// declared above and added here.
var problems = []problem{
	probKeyMissing, probKeyMalformed, probIdentityMissing, probTokenInvalid, probIdentityInvalid,
	probHopByHop, probPathNotCanonical, probBodyTooLarge, probBodyUnreadable, probMismatch,
	probInProgress, probNotReplayable, probOverloaded, probBuffersFull, probTooManyKeys, probTooManyBytes,
	probStoreFull, probStoreUnavailable, probRecordCorrupt, probUpstreamDown, probUpstreamFailed,
	probUpstreamTimeout, probReplayForbidden, probAuthorizerUnavailable, probOutcomeUnknown, probUpgradeRefused,
	probSignatureInvalid, probFirstSentInvalid, probKeyExpired, probRecordLost,
}

// problemContentType is the media type of every problem answer.
const problemContentType = "application/problem+json"

// with returns a copy of p carrying detail.
func (p problem) with(detail string) problem {
	p.Detail = detail
	return p
}

// writeProblem is the proxy's one error path: every error response goes
// out through here, in format (a route's problem_body), or, when nil, in
// the format for answers outside any route (Config.Problems), or else as
// problem+json.
func (hd *Handler) writeProblem(w http.ResponseWriter, p problem, requestID string, format *problemfmt.Format) {
	body, contentType := hd.renderProblem(p, requestID, format)
	h := w.Header()
	if hd.docsLink != "" && (p.Status == http.StatusBadRequest || p.Status == http.StatusConflict || p.Status == http.StatusUnprocessableEntity) {
		// The IETF draft: a 400, 409 or 422 links to the documentation of
		// the idempotency key's rules.
		h.Set("Link", hd.docsLink)
	}
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if p.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(p.retryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// renderProblem is p's body, with its full type URI and requestID, and
// its content type: in format (or the outside-route format) when set,
// problem+json otherwise or when the template fails (logged).
func (hd *Handler) renderProblem(p problem, requestID string, format *problemfmt.Format) ([]byte, string) {
	if format == nil {
		format = hd.problems
	}
	code := p.Type
	p.RequestID = requestID
	p.Type = hd.problemBase + p.Type
	if format != nil {
		d := problemfmt.Data{Status: p.Status, Type: p.Type, Code: code, Title: p.Title, Detail: p.Detail,
			RequestID: requestID, OriginalStatus: p.OriginalStatus}
		if p.retryAfter > 0 {
			d.RetryAfter, _ = strconv.Atoi(retryAfterSeconds(p.retryAfter))
		}
		body, err := format.Render(d)
		if err == nil {
			return body, format.ContentType()
		}
		hd.log.Error("problem_body failed to render; answering problem+json", "err", err, "request_id", requestID)
	}
	body, _ := json.Marshal(p) // a struct of strings and ints always marshals
	return append(body, '\n'), problemContentType
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}
