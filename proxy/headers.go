package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names are compared the way the upstream may compare them, not
// only the way Go does: CGI-style servers (wsgiref, older gunicorn, Puma,
// Unicorn, PHP) map X-Forwarded-User and X_Forwarded_User alike to
// HTTP_X_FORWARDED_USER. So wherever identity or the key is concerned,
// names match case-insensitively with '_' and '-' equivalent.

// sameName reports whether header names a and b are the same to a CGI
// server: equal ignoring case, with '_' and '-' equivalent.
func sameName(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// nameSet is a set of header names compared with sameName.
type nameSet []string

func (s nameSet) has(name string) bool {
	for _, n := range s {
		if sameName(n, name) {
			return true
		}
	}
	return false
}

// forwardingHeaders are the headers idemproxy itself sets or passes on as
// trust-bearing; none of them may be nominated as hop-by-hop.
var forwardingHeaders = nameSet{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", requestIDHeader}

// nominated returns the first header of guarded that h's Connection header
// names (ReverseProxy would strip it after idemproxy read it), or "".
func nominated(h http.Header, guarded nameSet) string {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			tok = strings.TrimSpace(tok)
			if tok == "" {
				continue
			}
			if guarded.has(tok) {
				return tok
			}
		}
	}
	return ""
}

// ownHeaderPrefix starts every header idemproxy's answers carry of its own
// (Idempotent-Replayed, -Reconciled, -Unknown-Since, -Resumed-After).
const ownHeaderPrefix = "Idempotent-"

// ownHeaders are idemproxy's other headers on its answers.
var ownHeaders = []string{retentionHeader, repeatabilityResult}

// dropOwnHeaders removes from h, an upstream's answer, every header
// idemproxy sets on its own answers, before it is stored or sent: only
// idemproxy says that an answer is a replay, reconciled, an
// outcome-unknown to ask about, or what a repeatable request's result was
// (a chained idemproxy, or an app that reflects headers, would otherwise
// speak for it).
func dropOwnHeaders(h http.Header) {
	for k := range h {
		if len(k) >= len(ownHeaderPrefix) && strings.EqualFold(k[:len(ownHeaderPrefix)], ownHeaderPrefix) {
			delete(h, k)
		}
	}
	for _, k := range ownHeaders {
		h.Del(k)
	}
}

// Header names idemproxy sets.
const (
	// replayedHeader marks a response replayed from the store.
	replayedHeader = "Idempotent-Replayed"
	// retentionHeader advertises, in seconds, how long a route replays a
	// settled answer (defaults.advertise_retention). Not a standard
	// header: the IETF draft leaves how to publish the expiry policy open.
	retentionHeader = "Idempotency-Retention"
	// requestIDHeader is passed through, or generated when absent, and
	// forwarded to the upstream.
	requestIDHeader = "X-Request-Id"
)

const (
	repeatabilityID     = "Repeatability-Request-Id"
	repeatabilityResult = "Repeatability-Result"
)

// retentionSeconds is d in whole seconds, for retentionHeader.
func retentionSeconds(d time.Duration) string {
	return strconv.FormatInt(int64(d/time.Second), 10)
}
