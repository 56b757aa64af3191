package validate

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/idemproxy/idemproxy/config"
)

var updateSchema = flag.Bool("update-schema", false, "rewrite the chart's values.schema.json config entry from config.JSONSchema")

// TestChartSchemaCoversConfig (issue 32): the chart's values.schema.json
// describes config as idemproxy's declarations do (config.JSONSchema), so
// that a typo or a wrong type in a route fails helm lint --strict, not the
// hot reload (refused quietly for minutes) and then the next pod's start.
// Before, config was any object. Run with -update-schema after a config
// change.
func TestChartSchemaCoversConfig(t *testing.T) {
	path := filepath.Join(chartDir, "values.schema.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	props := doc["properties"].(map[string]any)
	want := roundTrip(t, config.JSONSchema())
	if *updateSchema {
		props["config"] = want
		out, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(props["config"], want) {
		t.Fatalf("%s: config differs from config.JSONSchema(); run go test -run TestChartSchemaCoversConfig -update-schema", path)
	}

	lintWith := func(extra string) []string {
		vals, err := chartutil.ReadValues([]byte(extra))
		if err != nil {
			t.Fatal(err)
		}
		linter := lint.AllWithKubeVersion(chartDir, vals, "payments", nil)
		var msgs []string
		for _, m := range linter.Messages {
			if m.Severity >= support.WarningSev {
				msgs = append(msgs, m.Err.Error())
			}
		}
		return msgs
	}
	if msgs := lintWith("config:\n  upstream:\n    url: http://127.0.0.1:3000\n    timeout: 30s\n"); len(msgs) != 0 {
		t.Errorf("a valid config fails lint: %v", msgs)
	}
	for name, bad := range map[string]string{
		"a typo in a route":        "config:\n  routes:\n    - name: pay\n      match: POST /payments\n      relase_on: [503]\n",
		"a typo at the top":        "config:\n  upstreams:\n    url: http://127.0.0.1:3000\n",
		"a lease without a unit":   "config:\n  defaults:\n    lease: 10\n",
		"a route without a match":  "config:\n  routes:\n    - name: pay\n",
		"a size that is no size":   "config:\n  defaults:\n    max_request_body: banana\n",
		"require_key as a string":  "config:\n  defaults:\n    require_key: \"yes\"\n",
		"a list where one belongs": "config:\n  routes:\n    - name: pay\n      match: POST /payments\n      release_on: 503\n",
	} {
		if msgs := lintWith(bad); len(msgs) == 0 {
			t.Errorf("%s passes helm lint", name)
		} else if !strings.Contains(strings.Join(msgs, " "), "schema") {
			t.Errorf("%s: lint fails, but not on the schema: %v", name, msgs)
		}
	}
}

// roundTrip is v as encoding/json decodes it, for comparing with a file.
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
