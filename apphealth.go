package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The app's readiness, seen through the sidecar. The app listens on
// localhost only (nothing in the cluster may reach it but through the
// sidecar), so a kubelet probe cannot reach its health endpoint; and the
// sidecar's own /readyz must not depend on the app, or a slow app would
// take the sidecar's probes with it. So, as service meshes rewrite app
// probes, the sidecar probes upstream.health_path on localhost and serves
// the answer on its admin port as /app/readyz: the manifests make that the
// app container's readiness probe. A pod whose app is down is then not
// Ready, and no traffic is sent into its 502s.

// appProbeTimeout bounds one probe of the app's health path.
const appProbeTimeout = 2 * time.Second

// appHealthEvery is how often the background probe refreshes
// idemproxy_upstream_up.
const appHealthEvery = 5 * time.Second

// appHealth probes the app's health path.
type appHealth struct {
	// url is the health path on the upstream; empty when none is set.
	url    string
	client *http.Client
	up     prometheus.Gauge
}

func newAppHealth(upstream, path string, up prometheus.Gauge) *appHealth {
	a := &appHealth{up: up, client: &http.Client{
		Timeout: appProbeTimeout,
		// A redirect is an answer: the probe does not follow it (kubelet
		// counts 3xx as success, and so does this).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	if path != "" {
		u, err := url.Parse(upstream) // validated
		if err == nil {
			a.url = strings.TrimSuffix(u.String(), "/") + path
		}
	}
	return a
}

// probe asks the app once: ok for a 2xx or 3xx within appProbeTimeout.
func (a *appHealth) probe(ctx context.Context) (ok bool, why string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("User-Agent", "idemproxy-app-probe")
	resp, err := a.client.Do(req)
	if err != nil {
		return false, "the app did not answer: " + err.Error()
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	ok = resp.StatusCode >= 200 && resp.StatusCode < 400
	a.set(ok)
	return ok, fmt.Sprintf("the app answered %s", resp.Status)
}

func (a *appHealth) set(ok bool) {
	if ok {
		a.up.Set(1)
	} else {
		a.up.Set(0)
	}
}

// ServeHTTP is /app/readyz: 200 while the app answers its health path,
// 503 when not, 404 without upstream.health_path.
func (a *appHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if a.url == "" {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintln(w, "no app health path: set upstream.health_path")
		return
	}
	ok, why := a.probe(r.Context())
	if !ok {
		if r.Context().Err() == nil {
			a.set(false)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintln(w, why)
}

// watch keeps idemproxy_upstream_up current between probes, until ctx
// ends.
func (a *appHealth) watch(ctx context.Context) {
	if a.url == "" {
		return
	}
	t := time.NewTicker(appHealthEvery)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, appProbeTimeout)
		if ok, _ := a.probe(pctx); !ok && ctx.Err() == nil {
			a.set(false)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
