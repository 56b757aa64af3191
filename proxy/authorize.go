package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Results of a replay authorization, the values of the result label of
// idemproxy_replay_authorizations_total.
const (
	authAllowed     = "allowed"
	authForbidden   = "forbidden"
	authUnavailable = "unavailable"
)

// authorizedHeaders are the request headers the authorizer sees, besides
// the identity header: what decides who the caller is now.
var authorizedHeaders = []string{"Authorization", "Cookie", requestIDHeader}

// authorize asks the route's authorizer, as nginx auth_request does,
// whether the caller may still learn what is stored under its key: a
// replay, or the 409/422 that says the key exists. The stored response was
// authorized when it was computed; the caller's permissions may have
// changed since. It returns the reply when not, nil when it may.
func (x *exchange) authorize() *reply {
	s := &x.rt.settings
	if s.AuthorizeURL == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(x.r.Context(), s.AuthorizeTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.AuthorizeURL.String(), nil) // a parsed URL always makes a request
	req.Header.Set(x.h.id.header, x.a.principal)
	for _, h := range authorizedHeaders {
		if vs := x.r.Header.Values(h); len(vs) > 0 {
			req.Header[h] = vs
		}
	}
	req.Header.Set("X-Original-Method", x.r.Method)
	req.Header.Set("X-Original-URI", x.r.URL.RequestURI())
	start := time.Now()
	resp, err := x.h.authClient.Do(req)
	x.h.metrics.authorizeSeconds.Observe(time.Since(start).Seconds())
	status := 0
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		status = resp.StatusCode
	}
	result := authUnavailable
	switch {
	case status >= 200 && status < 300:
		result = authAllowed
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		result = authForbidden
	}
	x.h.metrics.authorizations.WithLabelValues(x.rt.name, result).Inc()
	switch result {
	case authAllowed:
		return nil
	case authForbidden:
		p := probReplayForbidden.with("the authorizer no longer allows this caller to see what is stored under this idempotency key")
		p.Status = status
		return refuse(outcomeRejected, p)
	}
	why := fmt.Sprintf("answered %d", status)
	if err != nil {
		why = err.Error()
	}
	p := probAuthorizerUnavailable.with("the replay authorizer could not be asked (" + why + "); retry later")
	p.retryAfter = time.Second
	return refuse(outcomeRejected, p)
}
