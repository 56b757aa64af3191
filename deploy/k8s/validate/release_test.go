package validate

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/idemproxy/idemproxy/internal/binarytest"
)

// releaseVersion is the latest release CHANGELOG.md names with its
// commit: what the manifests pin (an image that exists), never the version
// in progress.
func releaseVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[(v\d+\.\d+\.\d+)\] — \S+ \([0-9a-f]{7,40}\)`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("CHANGELOG.md names no released version with its commit")
	}
	return m[1]
}

// inProgressVersion is the version this tree builds (version.go): the
// next release with -dev, or the release itself at a cut.
func inProgressVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../../version.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*version\s*=\s*"(v[^"]+)"`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("version.go names no version")
	}
	return m[1]
}

// chartAppVersion is the chart's appVersion.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return c.Metadata.AppVersion
}

// TestManifestsFollowTheRelease (issue 32; issue 57): the image the
// kustomize example pins, and the chart's appVersion and version, are the
// latest release CHANGELOG.md names with its commit (an image that
// exists; the version in progress has none). The manifests use keys only this release reads
// (upstream.health_path, store.record_format): with an older image (they
// pinned v0.1.0) the pod crash-loops on an unknown key.
//
// The chart's own version is the version in progress (version.go) while
// it carries a pre-release suffix (issue 64: a package built from main
// never reuses a released chart version, 0.8.0-dev after the 0.7.0
// release); the release cut drops the suffix, and then both agree.
func TestManifestsFollowTheRelease(t *testing.T) {
	want := releaseVersion(t)
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	chartWant := strings.TrimPrefix(inProgressVersion(t), "v")
	if c.Metadata.AppVersion != want || c.Metadata.Version != chartWant {
		t.Errorf("Chart.yaml: version %s, appVersion %s; want %s (version.go: the version in progress) and %s (CHANGELOG.md: the latest release)", c.Metadata.Version, c.Metadata.AppVersion, chartWant, want)
	}
	b := build(t)
	dep := get[*appsv1.Deployment](t, b, "Deployment/payments")
	for _, ctr := range dep.Spec.Template.Spec.InitContainers {
		if ctr.Name == "idemproxy" && !strings.HasSuffix(ctr.Image, ":"+want) {
			t.Errorf("deploy/k8s pins %s, want the release %s (CHANGELOG.md)", ctr.Image, want)
		}
	}
	parent, err := loader.Load("testdata/parent")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range parent.Metadata.Dependencies {
		if d.Name == "idemproxy" && d.Version != c.Metadata.Version {
			t.Errorf("testdata/parent depends on idemproxy %s, the chart is %s", d.Version, c.Metadata.Version)
		}
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if dep := "{name: idemproxy, version: " + c.Metadata.Version + ","; !strings.Contains(string(readme), dep) {
		t.Errorf("the chart's README.md does not show the dependency as %q: its example names another version", dep)
	}
}

// previousChart extracts the chart of the release PREVIOUS_RELEASE names
// from this clone's history; it skips when the commit is not here, unless
// IDEMPROXY_REQUIRE_PREVIOUS=1.
func previousChart(t *testing.T) (dir, version string) {
	t.Helper()
	r := binarytest.PreviousT(t)
	dir = t.TempDir()
	if err := r.Extract(dir, "deploy/helm/idemproxy"); err != nil {
		t.Fatalf("extract the %s chart: %v", r.Version, err)
	}
	return filepath.Join(dir, "deploy/helm/idemproxy"), r.Version
}

// TestUpgradeKeepsEndpoints (issue 32): rendered from the previous
// release's chart and from this one with the same values, as helm upgrade
// does, the Deployment's selector is unchanged (it is immutable: helm
// upgrade would fail) and during the roll every Service and the PDB, old
// and new, select both the old pods and the new ones: no Service is left
// without endpoints until a new pod is Ready. (v0.4.0's chart moved them
// to a label v0.3.0's pods lacked.)
func TestUpgradeKeepsEndpoints(t *testing.T) {
	oldDir, oldVersion := previousChart(t)
	values := filepath.Join(chartDir, "ci", "standalone-values.yaml")
	vals, err := chartutil.ReadValuesFile(values)
	if err != nil {
		t.Fatal(err)
	}
	renderAt := func(dir string) built {
		c, err := loader.Load(dir)
		if err != nil {
			t.Fatalf("load %s: %v", dir, err)
		}
		return render(t, c, vals, "payments")
	}
	older, newer := renderAt(oldDir), renderAt(chartDir)
	oldDep := get[*appsv1.Deployment](t, older, "Deployment/payments-idemproxy")
	newDep := get[*appsv1.Deployment](t, newer, "Deployment/payments-idemproxy")
	if labels.Set(oldDep.Spec.Selector.MatchLabels).String() != labels.Set(newDep.Spec.Selector.MatchLabels).String() {
		t.Errorf("the Deployment's selector changed from %s (%v) to %v: it is immutable, helm upgrade fails", oldVersion, oldDep.Spec.Selector.MatchLabels, newDep.Spec.Selector.MatchLabels)
	}
	pods := map[string]labels.Set{oldVersion + " pods": oldDep.Spec.Template.Labels, "new pods": newDep.Spec.Template.Labels}
	for _, side := range []struct {
		name string
		b    built
	}{{oldVersion + " chart", older}, {"this chart", newer}} {
		for _, name := range []string{"Service/payments-idemproxy", "Service/payments-idemproxy-metrics"} {
			svc := get[*corev1.Service](t, side.b, name)
			for podName, pl := range pods {
				if !labels.SelectorFromSet(svc.Spec.Selector).Matches(pl) {
					t.Errorf("%s of the %s does not select the %s (%v vs %v): no endpoints during the roll", name, side.name, podName, svc.Spec.Selector, pl)
				}
			}
		}
		if obj, ok := side.b["PodDisruptionBudget/payments-idemproxy"]; ok {
			pdb := obj.(*policyv1.PodDisruptionBudget)
			for podName, pl := range pods {
				if !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(pl) {
					t.Errorf("the PDB of the %s does not select the %s", side.name, podName)
				}
			}
		}
	}
}

// checkMemLimit (issue 32): GOMEMLIMIT is 90% of the sidecar's memory
// limit, the rest for what the Go heap does not count. It was 100%: the
// GC let the heap grow to the very limit, and the container was killed.
func checkMemLimit(t *testing.T, c corev1.Container) {
	t.Helper()
	limit := c.Resources.Limits.Memory().Value()
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		got, err := strconv.ParseInt(e.Value, 10, 64)
		if err != nil || e.ValueFrom != nil {
			t.Errorf("GOMEMLIMIT %q (%v): want bytes, 90%% of the limit", e.Value, e.ValueFrom)
			return
		}
		if want := limit * 9 / 10; got != want {
			t.Errorf("GOMEMLIMIT %d, want %d: 90%% of limits.memory %d", got, want, limit)
		}
		return
	}
	t.Error("no GOMEMLIMIT on the sidecar")
}
