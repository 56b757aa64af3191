package validate

import (
	"bytes"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

var (
	metricName  = regexp.MustCompile(`\bidemproxy_[a-z][a-z0-9_]*[a-z0-9]`)
	commandLine = regexp.MustCompile(`\bidemproxy ((?:store|keys) [a-z][a-z-]*|size|demo)((?: +(?:-[a-z][a-z-]*|[^-\s` + "`" + `][^\s` + "`" + `]*))*)`)
	flagName    = regexp.MustCompile(`(?:^|\s)(-[a-z][a-z-]*)`)
	anyURL      = regexp.MustCompile(`[a-z]+://[^\s"']+`) // a role in a postgres:// URL is no metric
	runbookURL  = regexp.MustCompile(`runbook_url: *"?[^"\s]*/docs/operations\.md#([a-z0-9-]+)`)
)

// TestChartNamesWhatItsImageHas (issue 79): every metric, command and flag
// that the chart's alerts, dashboard, NOTES, migration Job and the
// runbooks its alerts link to name exists in the binary of the image the
// chart pins (built from this clone's history). v0.7.0's chart alerted on
// two metrics its image did not have (the alerts were silently dead) and
// its NOTES asked for a store migrate -grant it did not have.
func TestChartNamesWhatItsImageHas(t *testing.T) {
	bin, r := pinnedBinary(t)
	image, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	runbooks := sections(string(ops))

	files, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	texts := map[string]string{} // where → text naming things
	for _, f := range files {
		for name, text := range renderText(t, f) {
			texts[filepath.Base(f)+": "+name] = text
			for _, m := range runbookURL.FindAllStringSubmatch(text, -1) {
				section, ok := runbooks[m[1]]
				if !ok {
					t.Errorf("%s links to docs/operations.md#%s, which has no such heading", name, m[1])
					continue
				}
				texts["docs/operations.md#"+m[1]] = section
			}
		}
	}
	metrics, commands := 0, 0
	help := map[string]string{}
	for where, text := range texts {
		for _, name := range metricName.FindAllString(anyURL.ReplaceAllString(text, ""), -1) {
			metrics++
			if !hasMetric(image, name) {
				t.Errorf("%s names the metric %s, which %s does not have", where, name, r.Version)
			}
		}
		for _, m := range commandLine.FindAllStringSubmatch(text, -1) {
			commands++
			cmd := m[1]
			out, ok := help[cmd]
			if !ok {
				args := append(strings.Fields(cmd), "-h")
				b, _ := exec.Command(bin, args...).CombinedOutput()
				out = string(b)
				if !strings.Contains(out, "-") || strings.Contains(out, "the subcommands are") || strings.Contains(out, "unknown") {
					out = ""
				}
				help[cmd] = out
			}
			if out == "" {
				t.Errorf("%s names the command idemproxy %s, which %s does not have", where, cmd, r.Version)
				continue
			}
			for _, f := range flagName.FindAllStringSubmatch(m[2], -1) {
				if !regexp.MustCompile(`(?m)(^|\s|\[)` + regexp.QuoteMeta(f[1]) + `\b`).MatchString(out) {
					t.Errorf("%s names idemproxy %s %s, a flag %s does not have", where, cmd, f[1], r.Version)
				}
			}
		}
	}
	t.Logf("%d texts, %d metric names, %d commands (%v)", len(texts), metrics, commands, slices.Collect(maps.Keys(help)))
	// The test itself: it must have read something, and must see a name
	// the pinned binary lacks.
	if metrics < 20 || commands < 2 {
		t.Errorf("read %d metric names and %d commands from the chart: the patterns no longer match it", metrics, commands)
	}
	if hasMetric(image, "idemproxy_no_such_metric_total") {
		t.Error("a made-up metric passes")
	}
}

// hasMetric reports whether image holds the metric family name: the name
// itself, or for a histogram's series the family's.
func hasMetric(image []byte, name string) bool {
	if bytes.Contains(image, []byte(name)) {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && bytes.Contains(image, []byte(base)) {
			return true
		}
	}
	return false
}

// renderText is every file the chart renders with valuesFile, by name,
// NOTES.txt included.
func renderText(t *testing.T, valuesFile string) map[string]string {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValuesFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(chrt, vals.AsMap(), chartutil.ReleaseOptions{Name: "payments", Namespace: "payments", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(chrt, rv)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sections splits markdown into its headings' sections, by GitHub's
// anchor of the heading: each runs to the next heading of its level or
// above.
func sections(md string) map[string]string {
	lines := strings.Split(md, "\n")
	out := map[string]string{}
	for i, line := range lines {
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		end := i + 1
		for ; end < len(lines); end++ {
			l := len(lines[end]) - len(strings.TrimLeft(lines[end], "#"))
			if l > 0 && l <= level && strings.HasPrefix(lines[end][l:], " ") {
				break
			}
		}
		out[anchor(line[level+1:])] = strings.Join(lines[i:end], "\n")
	}
	return out
}

// anchor is GitHub's anchor of a heading: lower case, spaces to hyphens,
// punctuation but hyphens and underscores dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}
