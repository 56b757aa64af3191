package config

import (
	"strings"
	"time"
)

// Upstream is the application idemproxy protects.
type Upstream struct {
	// URL is the upstream's base URL, e.g. http://127.0.0.1:3000.
	URL string `yaml:"url"`
	// Timeout is how long a client waits for the upstream's answer; past
	// it the client gets 504 and, with a LateAnswerWindow, the upstream
	// call goes on.
	Timeout time.Duration `yaml:"timeout"`
	// LateAnswerWindow is how much longer than Timeout the owner keeps the
	// upstream call open, renewing its lease, to store a late answer for
	// the client's retries. Zero cancels the call at Timeout.
	LateAnswerWindow time.Duration `yaml:"late_answer_window"`
	// MaxLateCalls caps the calls running past Timeout at once in this
	// process; beyond it a call is cancelled at Timeout and its route's
	// unknown_outcome applies. Zero holds none.
	MaxLateCalls int `yaml:"max_late_calls"`
	// LateCallsPrincipalShare is the most of MaxLateCalls one principal's
	// calls may hold; beyond it, that principal's call is the one cancelled
	// at Timeout. Zero: no share of its own.
	LateCallsPrincipalShare float64 `yaml:"late_calls_principal_share"`
	// HealthPath, when set, is the app's own health endpoint (e.g.
	// /healthz), which idemproxy probes on the upstream and serves on its
	// admin port as /app/readyz, for the app container's readiness probe:
	// the app listens on localhost only, where a kubelet probe cannot
	// reach it. Empty: /app/readyz answers 404.
	HealthPath string `yaml:"health_path"`
}

// Budget is the longest a protected request may run upstream: Timeout
// plus LateAnswerWindow.
func (u Upstream) Budget() time.Duration { return u.Timeout + u.LateAnswerWindow }

func (c *Config) validateUpstream(add problemf) {
	if u, ok := httpURL(c.Upstream.URL); !ok {
		add("upstream.url", "must be an absolute http or https URL, got %q", c.Upstream.URL)
	} else if key, own := ownListener(u, c.Listen, c.AdminListen); own != "" {
		add("upstream.url", "%q is idemproxy's own %s (%s): every request would loop back into the proxy; point it at the app", c.Upstream.URL, key, own)
	}
	if c.Upstream.Timeout <= 0 {
		add("upstream.timeout", "must be positive, got %s", c.Upstream.Timeout)
	}
	if c.Upstream.LateAnswerWindow < 0 {
		add("upstream.late_answer_window", "must not be negative (0s cancels the upstream call at upstream.timeout), got %s", c.Upstream.LateAnswerWindow)
	}
	if c.Upstream.LateCallsPrincipalShare < 0 || c.Upstream.LateCallsPrincipalShare > 1 {
		add("upstream.late_calls_principal_share", "must be between 0%% and 100%%, got %g%%", c.Upstream.LateCallsPrincipalShare*100)
	}
	if c.Upstream.MaxLateCalls < 0 {
		add("upstream.max_late_calls", "must not be negative, got %d", c.Upstream.MaxLateCalls)
	}
	if p := c.Upstream.HealthPath; p != "" && (!strings.HasPrefix(p, "/") || strings.ContainsAny(p, "# \t")) {
		add("upstream.health_path", "must be a path on the upstream starting with / (e.g. /healthz), got %q", p)
	}
}
