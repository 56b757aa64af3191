package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// DefaultReconcileTimeout is routes[].reconcile.timeout.
const DefaultReconcileTimeout = 2 * time.Second

// Reconcile is a route's reconcile block: how to ask the upstream what
// happened to a key whose outcome idemproxy cannot know.
type Reconcile struct {
	// URL is a path on upstream.url, with {key}, {principal} and {route}
	// replaced by their values escaped for where they stand; empty: the
	// route does not reconcile.
	URL string `yaml:"url"`
	// Found are the statuses that say the effect happened; Absent those
	// that say it did not.
	Found  []int `yaml:"found"`
	Absent []int `yaml:"absent"`
	// Status, when set, is the status stored for a found answer; zero
	// stores a lookup's 200 as 201 on a POST route, and any other status
	// as the lookup gave it.
	Status int `yaml:"status"`
	// Timeout bounds one lookup.
	Timeout time.Duration `yaml:"timeout"`
	// AbsentAfter is how old the first attempt must be on Redis' clock
	// before an absent answer is believed.
	AbsentAfter time.Duration `yaml:"absent_after"`
}

// defaultReconcile is a route's reconcile block before its YAML.
func defaultReconcile() Reconcile {
	return Reconcile{Found: []int{200}, Absent: []int{404}, Timeout: DefaultReconcileTimeout}
}

// validate checks a route's reconcile block against the route (r) and the
// upstream it asks (u).
func (rc Reconcile) validate(path string, r Route, u Upstream, add problemf) {
	if rc.URL == "" {
		return
	}
	switch {
	case !strings.HasPrefix(rc.URL, "/"):
		add(path+"url", "must be a path on upstream.url starting with /, got %q", rc.URL)
	case !strings.Contains(rc.URL, "{key}"):
		add(path+"url", "must carry {key}, or every key would get the same answer: %q", rc.URL)
	case strings.Contains(rc.URL, "#"):
		add(path+"url", "must not have a fragment (it is never sent): %q", rc.URL)
	default:
		rest := strings.NewReplacer("{key}", "", "{principal}", "", "{route}", "").Replace(rc.URL)
		if strings.ContainsAny(rest, "{}") {
			add(path+"url", "only {key}, {principal} and {route} are replaced: %q", rc.URL)
		}
	}
	statuses := func(name string, list []int) {
		if len(list) == 0 {
			add(path+name, "must name at least one status")
		}
		for i, s := range list {
			if s < 100 || s > 599 {
				add(fmt.Sprintf("%s%s[%d]", path, name, i), "must be an HTTP status between 100 and 599, got %d", s)
			}
		}
	}
	statuses("found", rc.Found)
	statuses("absent", rc.Absent)
	for _, s := range rc.Found {
		if slices.Contains(rc.Absent, s) {
			add(path+"absent", "status %d is also in found: one answer cannot say both", s)
		}
	}
	if rc.Status != 0 && (rc.Status < 200 || rc.Status > 599) {
		add(path+"status", "must be 0 (the default: 201 for a lookup's 200 on a POST route, else the lookup's) or an HTTP status between 200 and 599, got %d", rc.Status)
	}
	if rc.Timeout <= 0 || rc.Timeout > time.Minute {
		add(path+"timeout", "must be between 1ms and 1m, got %s", rc.Timeout)
	}
	if least := u.Budget(); rc.AbsentAfter < least {
		add(path+"absent_after", "must be at least upstream.timeout + upstream.late_answer_window (%s), the longest a request runs in the app, got %s: an absent answer before then may be a request still running", least, rc.AbsentAfter)
	}
	if rc.AbsentAfter >= r.Settings.Retention {
		add(path+"absent_after", "must be shorter than the route's retention (%s), or an absent answer is never believed, got %s", r.Settings.Retention, rc.AbsentAfter)
	}
	if r.Webhook.Provider != "" {
		add(path+"url", "a webhook route cannot reconcile: its provider, not the upstream, decides what a redelivery means")
	}
}
