package proxy

// The reconcile lookup: how a route asks the upstream about a key
// (routes[].reconcile), and what its answer says.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// expand fills the template: values in the path are path-escaped (a "/"
// in a key stays inside its segment, and one made only of dots is
// escaped whole), values in the query query-escaped.
func (rc *Reconcile) expand(key, principal, route string) (path, rawQuery string) {
	p, q, _ := strings.Cut(rc.URL, "?")
	fill := func(s string, escape func(string) string) string {
		return strings.NewReplacer(fieldKey, escape(key), fieldPrincipal, escape(principal), fieldRoute, escape(route)).Replace(s)
	}
	return fill(p, pathSegment), fill(q, url.QueryEscape)
}

// pathSegment escapes v to stand as (part of) one path segment: a value
// made only of dots is all %2E, so that no router's dot-segment removal
// ("..", ".") can make the lookup another path.
func pathSegment(v string) string {
	if v != "" && strings.Trim(v, ".") == "" {
		return strings.Repeat("%2E", len(v))
	}
	return url.PathEscape(v)
}

// lookupURL is the lookup's URL on upstream: the upstream's path joined
// with the template's, as a forwarded request's path is.
func lookupURL(upstream *url.URL, rc *Reconcile, key, principal, route string) *url.URL {
	path, query := rc.expand(key, principal, route)
	u := *upstream
	u.RawQuery = query
	u.Fragment = ""
	base := strings.TrimSuffix(upstream.EscapedPath(), "/")
	u.RawPath = base + path
	var err error
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		u.Path = u.RawPath // expand escaped what it added; the rest was validated
	}
	return &u
}

// lookupHeaders are never stored from a found answer: they describe the
// lookup's own connection or body, not the effect's answer.
var lookupHeaders = []string{"Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "Trailer", "Upgrade"}

// lookup asks the upstream once what happened to key for principal on
// the route: found (with the answer to store), absent or unresolved. An
// answer counts only when it echoes the key in the key header, so a 404
// from a router that never reached the app is never "absent". A found
// body larger than max is unresolved: it could not be replayed whole.
func (h *Handler) lookup(ctx context.Context, rt *route, principal, key string, max int64) lookupAnswer {
	rc := rt.settings.Reconcile
	ctx, cancel := context.WithTimeout(ctx, rc.Timeout)
	defer cancel()
	u := lookupURL(h.upstream, rc, key, principal, rt.name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return lookupAnswer{result: lookupUnresolved, why: err.Error()}
	}
	req.Header.Set(h.id.header, principal)
	req.Header.Set(rt.settings.KeyHeader, key)
	req.Header.Set("Accept", "*/*")
	resp, err := h.authClient.Do(req)
	if err != nil {
		return lookupAnswer{result: lookupUnresolved, why: err.Error()}
	}
	defer resp.Body.Close()
	ans := lookupVerdict(rt, resp, key, max)
	ans.upstreamStatus = resp.StatusCode
	return ans
}

// lookupVerdict reads one lookup answer.
func lookupVerdict(rt *route, resp *http.Response, key string, max int64) lookupAnswer {
	rc := rt.settings.Reconcile
	body, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	switch {
	case err != nil:
		return lookupAnswer{result: lookupUnresolved, why: "reading the lookup's answer: " + err.Error()}
	case resp.Header.Get(rt.settings.KeyHeader) != key:
		return lookupAnswer{result: lookupUnresolved, why: fmt.Sprintf("the lookup answered %d without echoing the key in %s", resp.StatusCode, rt.settings.KeyHeader)}
	case slices.Contains(rc.Absent, resp.StatusCode):
		return lookupAnswer{result: lookupAbsent, status: resp.StatusCode}
	case !slices.Contains(rc.Found, resp.StatusCode):
		return lookupAnswer{result: lookupUnresolved, why: fmt.Sprintf("the lookup answered %d, neither found nor absent", resp.StatusCode)}
	case int64(len(body)) > max:
		return lookupAnswer{result: lookupUnresolved, why: fmt.Sprintf("the lookup's found answer is larger than max_response_body (%d bytes)", max)}
	}
	header := resp.Header.Clone()
	dropOwnHeaders(header)
	for _, k := range lookupHeaders {
		header.Del(k)
	}
	for _, k := range rt.settings.ExcludeHeaders {
		header.Del(k)
	}
	return lookupAnswer{result: lookupFound, status: foundStatus(rt, resp.StatusCode), header: header, body: body}
}

// foundStatus is the status a found answer is stored with: the route's
// reconcile.status when set; else, on a POST route, a lookup's 200 is
// stored as 201 (a POST that took effect created what the lookup found,
// and its clients expect the 201 its first execution would have
// answered: the lookup is a GET, whose success is 200); any other
// status as the lookup gave it.
func foundStatus(rt *route, status int) int {
	switch {
	case rt.settings.Reconcile.Status != 0:
		return rt.settings.Reconcile.Status
	case status == http.StatusOK && strings.HasPrefix(rt.settings.Pattern, http.MethodPost+" "):
		return http.StatusCreated
	}
	return status
}

// Header names of reconciled and reconcilable records.
const (
	// reconciledHeader marks an answer the upstream's lookup gave; it is
	// stored with it, so every replay carries it.
	reconciledHeader = "Idempotent-Reconciled"
	// unknownSinceHeader is stored on a reconcile route's outcome-unknown
	// record: when the first attempt's claim ran, Unix milliseconds on
	// Redis' clock (0 when not read), from which an absent answer is
	// judged. It tells such a record from any other answer by what the
	// previous release already stores and replays: a header.
	unknownSinceHeader = "Idempotent-Unknown-Since"
)
