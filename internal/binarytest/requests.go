package binarytest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// PayRequest is the common protected request of the binary's tests: a
// JSON POST of body to url as alice (X-Forwarded-User, honoured from
// loopback) with key (none when empty). Safe to build in a goroutine.
func PayRequest(url, key, body string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("X-Forwarded-User", "alice")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

// Post sends PayRequest and answers its status and body.
func Post(tb testing.TB, url, key, body string) (int, string) {
	tb.Helper()
	resp, b := PostWith(tb, url, "alice", key, body, nil)
	return resp.StatusCode, b
}

// PostWith is PayRequest as principal, with header's fields added; it
// answers the response (its body read) and the body.
func PostWith(tb testing.TB, url, principal, key, body string, header http.Header) (*http.Response, string) {
	tb.Helper()
	req := PayRequest(url, key, body)
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("X-Forwarded-User", principal)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// Get answers status and body of a GET.
func Get(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Scrape returns admin's /metrics.
func Scrape(tb testing.TB, admin string) string {
	tb.Helper()
	_, text := Get(tb, admin+"/metrics")
	return text
}

// StoreUp reads idemproxy_store_up from admin's /metrics: whether any
// series is there yet, and whether every master is up.
func StoreUp(tb testing.TB, admin string) (seen, up bool) {
	tb.Helper()
	up = true
	for line := range strings.SplitSeq(Scrape(tb, admin), "\n") {
		if rest, ok := strings.CutPrefix(line, "idemproxy_store_up{"); ok {
			seen = true
			up = up && strings.HasSuffix(rest, "} 1")
		}
	}
	return seen, seen && up
}
