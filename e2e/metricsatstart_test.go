package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// TestAlertedFamiliesExistAtStart (issue 64): every metric family the
// shipped alert rules read has its series on a fresh sidecar's /metrics
// before any request, at 0 for every label value known at start, so that
// increase() sees the first event after a start. v0.7.0 created
// idemproxy_stream_ends_total, idemproxy_unknown_outcomes_total,
// idemproxy_stream_attached_total and idemproxy_record_errors_total at
// their first increment: IdemproxyStreamsBreakingOff stayed silent for the
// first aborts after every pod start. On the PostgreSQL store, with a
// streaming, a reconciling and a webhook route and the app's health path.
func TestAlertedFamiliesExistAtStart(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(filepath.Join("..", "deploy", "k8s", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pg := pgtest.Start(t)
	up := binarytest.NewRecorder(t)
	secret := filepath.Join(t.TempDir(), "gh")
	if err := os.WriteFile(secret, []byte("gh-secret-0123"), 0o400); err != nil {
		t.Fatal(err)
	}
	sc := startBinary(t, fmt.Sprintf(`upstream:
  url: %q
  health_path: /
store:
  postgres:
    url: %q
  record_format: 4
routes:
  - name: pay
    match: "POST /payments"
    reconcile:
      url: "/payments/by-key/{key}"
      absent_after: 6m
  - name: chat
    match: "POST /v1/chat/completions"
    stream: auto
  - name: github-events
    match: "POST /webhooks/github"
    webhook: {provider: github, secret_files: [%q], events: [push]}
`, up.URL, pg.URL, secret))
	poll.Until(t, "the store watcher's first look", func() bool { return metric(t, sc.Admin, "idemproxy_store_up{") })
	text := scrape(t, sc.Admin)
	for _, family := range uniq(regexp.MustCompile(`idemproxy_[a-z_]+`).FindAllString(string(rules), -1)) {
		if !regexp.MustCompile(`(?m)^` + family + `(\{|\s)`).MatchString(text) {
			t.Errorf("the rules read %s, which a fresh sidecar does not expose", family)
		}
	}
	for _, series := range []string{
		`idemproxy_stream_ends_total{end="aborted",route="chat"} 0`,
		`idemproxy_stream_ends_total{end="ended",route="chat"} 0`,
		`idemproxy_stream_attached_total{route="chat"} 0`,
		`idemproxy_reconciled_total{result="absent",route="pay"} 0`,
		`idemproxy_unknown_outcomes_total{handling="orphan",route="pay"} 0`,
		`idemproxy_record_errors_total{reason="tampered"} 0`,
		`idemproxy_webhook_deliveries_total{result="executed",route="github-events"} 0`,
		`idemproxy_store_wakeups_total{how="poll"} 0`,
	} {
		if !strings.Contains(text, series) {
			t.Errorf("a fresh /metrics lacks %s", series)
		}
	}
}

// uniq is ss without repeats, in order.
func uniq(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
