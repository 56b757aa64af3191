package proxy

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

// problemTypePrefix starts the type URI of every problem idemproxy answers
// with. The part after it is stable and listed in docs/configuration.md.
const problemTypePrefix = "urn:idemproxy:problem:"

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

// The problems idemproxy answers with, one per case, each declared once.
// Titles never change with the request; detail says what was wrong with
// this one.
var (
	probKeyMissing            = declare("key-missing", http.StatusBadRequest, "Idempotency key required")
	probKeyMalformed          = declare("key-malformed", http.StatusBadRequest, "Malformed idempotency key")
	probIdentityMissing       = declare("identity-missing", http.StatusUnauthorized, "Authenticated principal required")
	probTokenInvalid          = declare("token-invalid", http.StatusUnauthorized, "Bearer token not valid")
	probIdentityInvalid       = declare("identity-invalid", http.StatusBadRequest, "Ambiguous principal")
	probHopByHop              = declare("hop-by-hop-forbidden", http.StatusBadRequest, "A header idemproxy relies on was nominated as hop-by-hop")
	probPathNotCanonical      = declare("path-not-canonical", http.StatusBadRequest, "The request path is not in canonical form")
	probBodyTooLarge          = declare("body-too-large", http.StatusRequestEntityTooLarge, "Request body too large")
	probBodyUnreadable        = declare("body-unreadable", http.StatusBadRequest, "Request body could not be read")
	probCallInvalid           = declare("call-invalid", http.StatusBadRequest, "Not a unary gRPC call idemproxy can read")
	probMismatch              = declare("key-reused", http.StatusUnprocessableEntity, "Idempotency key reused with a different request")
	probInProgress            = declare("request-in-progress", http.StatusConflict, "A request with this idempotency key is in progress")
	probNotReplayable         = declare("response-not-replayable", http.StatusConflict, "The original response was too large to store and cannot be replayed")
	probOverloaded            = declare("overloaded", http.StatusServiceUnavailable, "The route forwards as many requests as it may")
	probBuffersFull           = declare("buffers-full", http.StatusServiceUnavailable, "idemproxy holds as many request bytes as it may")
	probTooManyKeys           = declare("too-many-keys", http.StatusTooManyRequests, "Too many new idempotency keys")
	probTooManyBytes          = declare("too-many-bytes", http.StatusTooManyRequests, "This principal holds its whole share of request buffers")
	probStoreFull             = declare("store-full", http.StatusServiceUnavailable, "Idempotency store full")
	probStoreUnavailable      = declare("store-unavailable", http.StatusServiceUnavailable, "Idempotency store unavailable")
	probRecordCorrupt         = declare("record-unreadable", http.StatusInternalServerError, "Stored idempotency record could not be read")
	probUpstreamDown          = declare("upstream-unreachable", http.StatusBadGateway, "Upstream unreachable; the request was not sent")
	probUpstreamFailed        = declare("upstream-failed", http.StatusBadGateway, "Upstream connection failed after the request was sent")
	probUpstreamTimeout       = declare("upstream-timeout", http.StatusGatewayTimeout, "Upstream did not answer in time")
	probReplayForbidden       = declare("replay-forbidden", http.StatusForbidden, "Not authorized to see the stored response")
	probAuthorizerUnavailable = declare("authorizer-unavailable", http.StatusServiceUnavailable, "The replay authorizer is unavailable")
	probUpgradeRefused        = declare("upgrade-refused", http.StatusBadRequest, "Protocol upgrade refused")
	probSignatureInvalid      = declare("signature-invalid", http.StatusUnauthorized, "Webhook signature missing, wrong or outside the tolerance")
	probEventMalformed        = declare("event-malformed", http.StatusBadRequest, "Webhook event header missing, repeated or malformed")
	probEventNotAccepted      = declare("event-not-accepted", http.StatusBadRequest, "Webhook event not accepted by this route")
	probFirstSentInvalid      = declare("first-sent-invalid", http.StatusBadRequest, "Malformed first-sent time")
	probKeyExpired            = declare("key-expired", http.StatusPreconditionFailed, "The request was first sent longer ago than its record is kept")
	probRecordLost            = declare("record-lost", http.StatusPreconditionFailed, "The request was first sent before the store lost its records")
	probOutcomeUnknown        = declare("outcome-unknown", http.StatusBadGateway, "The outcome of the request sent with this idempotency key is unknown")
)

// problems lists every problem above, in order, as declare made them:
// docs/configuration.md's table of problem types must name each
// (TestReadmeListsEveryProblemType). A new problem is one declare line.
var problems []problem

// declare makes a problem type and lists it in problems.
func declare(typ string, status int, title string) problem {
	p := problem{Type: typ, Status: status, Title: title}
	problems = append(problems, p)
	return p
}

// problemContentType is the media type of every problem answer.
const problemContentType = "application/problem+json"

// with returns a copy of p carrying detail.
func (p problem) with(detail string) problem {
	p.Detail = detail
	return p
}

// problemWriter writes the proxy's error answers: the base of their type
// URIs, the Link of the key's rules, and the format of answers outside
// any route.
type problemWriter struct {
	// base starts problem types; docsLink, when set, is the Link header
	// value of 400, 409 and 422 answers.
	base, docsLink string
	// outside, when set, shapes answers outside any route.
	outside *problemfmt.Format
	log     *slog.Logger
}

// write is the proxy's one error path outside a route's front: answers
// outside any route and pass-through errors, in format, or, when nil, in
// the format for answers outside any route (Config.Problems), or else as
// problem+json. A route's answers go through its framer, the same way.
func (pw *problemWriter) write(w http.ResponseWriter, p problem, requestID string, format *problemfmt.Format) {
	writeFramed(w, httpFramer{pw: pw, format: format}.frame(p, requestID))
}

// framer frames idemproxy's own answers on a route: the refusals its front
// writes, and the outcome-unknown record the protocol stores and replays
// as it was framed. Each route has one, by the protocol its front speaks
// (HTTP: problem+json, or the route's problem_body).
type framer interface {
	// frame is p, answering the request requestID, as the front sends it.
	frame(p problem, requestID string) framed
}

// framed is one of idemproxy's own answers as a route's front frames it:
// its status, the headers it is sent and stored with, and its body.
type framed struct {
	status int
	header http.Header
	body   []byte
	// noLength sends no Content-Length (a gRPC Trailers-Only answer is
	// one HEADERS frame).
	noLength bool
}

// httpFramer frames answers as problem+json, or in format (a route's
// problem_body) when set.
type httpFramer struct {
	pw     *problemWriter
	format *problemfmt.Format
}

// frame is p as an HTTP answer: its body in the route's format, no-store,
// Retry-After when p says when to come back, and, when problems.docs_url
// is set, the Link the IETF draft gives 400, 409 and 422 answers to the
// documentation of the key's rules.
func (f httpFramer) frame(p problem, requestID string) framed {
	body, contentType := f.pw.render(p, requestID, f.format)
	h := http.Header{"Content-Type": {contentType}, "Cache-Control": {"no-store"}}
	if f.pw.docsLink != "" && (p.Status == http.StatusBadRequest || p.Status == http.StatusConflict || p.Status == http.StatusUnprocessableEntity) {
		h["Link"] = []string{f.pw.docsLink}
	}
	if p.retryAfter > 0 {
		h["Retry-After"] = []string{retryAfterSeconds(p.retryAfter)}
	}
	return framed{status: p.Status, header: h, body: body}
}

// writeFramed writes an answer a framer framed, with its length.
func writeFramed(w http.ResponseWriter, f framed) {
	h := w.Header()
	for k, vs := range f.header {
		h[k] = vs
	}
	if !f.noLength {
		h.Set("Content-Length", strconv.Itoa(len(f.body)))
	}
	w.WriteHeader(f.status)
	_, _ = w.Write(f.body)
}

// render is p's body, with its full type URI and requestID, and its
// content type: in format (or the outside-route format) when set,
// problem+json otherwise or when the template fails (logged).
func (pw *problemWriter) render(p problem, requestID string, format *problemfmt.Format) ([]byte, string) {
	if format == nil {
		format = pw.outside
	}
	code := p.Type
	p.RequestID = requestID
	p.Type = pw.base + p.Type
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
		pw.log.Error("problem_body failed to render; answering problem+json", "err", err, "request_id", requestID)
	}
	body, _ := json.Marshal(p) // a struct of strings and ints always marshals
	return append(body, '\n'), problemContentType
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}
