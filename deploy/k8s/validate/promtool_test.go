package validate

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// promtool returns the path of Prometheus' promtool. It skips the test
// when promtool is absent, unless IDEMPROXY_REQUIRE_PROMTOOL=1 (set by
// .ci/run, which installs Debian's prometheus package) fails it instead.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("IDEMPROXY_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool not in PATH and IDEMPROXY_REQUIRE_PROMTOOL=1: apt-get install prometheus")
		}
		t.Skip("promtool not in PATH (apt-get install prometheus); set IDEMPROXY_REQUIRE_PROMTOOL=1 to fail instead")
	}
	return p
}

// TestAlertRulesWithPromtool checks the kustomize example's alert rules
// with Prometheus' own tool: `promtool check rules`, then the unit tests
// of deploy/k8s/alerts_test.yaml, in which every alert must have a case
// where it fires and one where it stays silent.
func TestAlertRulesWithPromtool(t *testing.T) {
	bin := promtool(t)
	rule := get[*monitoringv1.PrometheusRule](t, build(t), "PrometheusRule/payments-idemproxy")
	rules, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("../alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}

	var suite struct {
		Tests []struct {
			Name  string `json:"name"`
			Cases []struct {
				Alert  string `json:"alertname"`
				Alerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &suite); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range suite.Tests {
		for _, c := range tc.Cases {
			if len(c.Alerts) > 0 {
				fires[c.Alert] = true
			} else {
				silent[c.Alert] = true
			}
		}
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				continue // a recording rule: alerts_test.yaml checks its value (promql_expr_test)
			}
			if !fires[r.Alert] || !silent[r.Alert] {
				t.Errorf("alert %s: alerts_test.yaml needs a case where it fires (%t) and one where it stays silent (%t)", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		}
	}
}

// TestChartAlertThresholdFollowsConfig: IdemproxyClaimStuck's threshold in
// the chart is upstream.timeout + late_answer_window + 15s of the config
// it renders, not a number that assumes the defaults.
func TestChartAlertThresholdFollowsConfig(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("config:\n  upstream:\n    timeout: 1m30s\n    late_answer_window: 10m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := renderChart(t, filepath.Join(chartDir, "ci", "standalone-values.yaml"), values)
	rule := get[*monitoringv1.PrometheusRule](t, objs, "PrometheusRule/payments-idemproxy")
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "IdemproxyClaimStuck" && !bytes.HasSuffix([]byte(r.Expr.String()), []byte("> 705")) {
				t.Errorf("IdemproxyClaimStuck: %s, want a threshold of 90 + 600 + 15 = 705", r.Expr.String())
			}
		}
	}
}
