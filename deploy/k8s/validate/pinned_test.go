package validate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"

	"github.com/idemproxy/idemproxy/internal/binarytest"
)

// pinnedBinary is the binary of the image the chart pins (its appVersion,
// PREVIOUS_RELEASE), built from this clone's history, and that release.
func pinnedBinary(t *testing.T) (string, binarytest.Release) {
	t.Helper()
	r := binarytest.PreviousT(t)
	if app := chartAppVersion(t); app != r.Version {
		t.Fatalf("the chart pins %s, PREVIOUS_RELEASE is %s: build the pinned one", app, r.Version)
	}
	bin, err := r.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return bin, r
}

// TestChartRunsWhatItRenders (issue 64): every ci/*-values.yaml, the
// PostgreSQL one included, renders a config that the binary of the image
// the chart pins (its appVersion, the latest release, built from this
// clone's history) accepts with -check. v0.7.0's chart pinned v0.6.0,
// whose -check refused the store.postgres it rendered (create_schema: an
// unknown key): the pod crash-looped.
func TestChartRunsWhatItRenders(t *testing.T) {
	bin, r := pinnedBinary(t)
	files, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if len(files) == 0 {
		t.Fatal("no ci/*-values.yaml")
	}
	sawPostgres := false
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b := renderChart(t, f)
			cm := get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-config")
			text := cm.Data["config.yaml"]
			sawPostgres = sawPostgres || strings.Contains(text, "postgres:")
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(bin, "-config", path, "-check", "-skip-files").CombinedOutput(); err != nil {
				t.Errorf("%s -check refuses what the chart renders with %s: %v\n%s\n--- config.yaml\n%s", r.Version, filepath.Base(f), err, out, text)
			}
		})
	}
	if !sawPostgres {
		t.Error("no ci values file renders store.postgres")
	}
}

// TestChartOnPostgres (issue 64): a failover URL's comma survives --set
// when escaped as the chart's README writes it, and NOTES.txt speaks of
// the store the chart renders: PostgreSQL, its schema and its password
// Secret, never Redis.
func TestChartOnPostgres(t *testing.T) {
	const url = `postgres://idemproxy@db-1:5432,db-2:5432/app?target_session_attrs=read-write&sslmode=verify-full`
	vals := map[string]any{}
	if err := strvals.ParseInto(`postgres.url=`+strings.Replace(url, ",", `\,`, 1), vals); err != nil {
		t.Fatal(err)
	}
	if got := vals["postgres"].(map[string]any)["url"]; got != url {
		t.Errorf("--set postgres.url with the README's escaping gives %q, want %q", got, url)
	}
	notes := renderText(t, filepath.Join(chartDir, "ci", "postgres-values.yaml"))["idemproxy/templates/NOTES.txt"]
	if !strings.Contains(notes, "The store is PostgreSQL") || strings.Contains(notes, "Redis") {
		t.Errorf("NOTES.txt on the PostgreSQL store:\n%s", notes)
	}
}

// TestChartRefusesWhatItsImageCannotRun (issue 64): keys a later release
// added are refused when the chart renders, naming the release that
// reads them, while the chart runs an older image (image.tag v0.7.0;
// before the v0.8.0 cut, its appVersion); with the chart's own image
// (v0.8.0 or later) they render.
func TestChartRefusesWhatItsImageCannotRun(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	render := func(values string) (map[string]string, error) {
		t.Helper()
		vals, err := chartutil.ReadValues([]byte(values))
		if err != nil {
			t.Fatal(err)
		}
		rv, err := chartutil.ToRenderValues(chrt, vals.AsMap(), chartutil.ReleaseOptions{Name: "payments", Namespace: "payments", IsInstall: true}, chartutil.DefaultCapabilities)
		if err != nil {
			t.Fatal(err)
		}
		return engine.Render(chrt, rv)
	}
	const listen = "postgres:\n  url: postgres://idemproxy@db:5432/app\n  listenUrl: postgres://idemproxy@db-direct:5432/app\n"
	const events = "config:\n  routes:\n    - name: gh\n      match: \"POST /webhooks/github\"\n      webhook: {provider: github, secret_files: [/s], events: [push]}\n"
	const format5 = "config:\n  store:\n    record_format: 5\n"
	// A key the release after the chart's image adds is refused with the
	// image the chart pins, and renders with an image that has it.
	const grpcRoute = "config:\n  routes:\n    - name: orders\n      match: \"POST /shop.v1.Orders/CreateOrder\"\n      protocol: grpc\n"
	if _, err := render(grpcRoute); err == nil || !strings.Contains(err.Error(), "needs idemproxy v0.9.0 or later") {
		t.Errorf("routes[].protocol with the chart's image %s: %v, want it refused naming v0.9.0", chartAppVersion(t), err)
	}
	if files, err := render(grpcRoute + "image:\n  tag: v0.9.0\n"); err != nil || !strings.Contains(files["idemproxy/templates/configmap.yaml"], "protocol: grpc") {
		t.Errorf("routes[].protocol with image.tag v0.9.0: %v", err)
	}
	for name, values := range map[string]string{"postgres.listenUrl": listen, "webhook.events": events, "store.record_format 5": format5} {
		if _, err := render(values + "image:\n  tag: v0.7.0\n"); err == nil || !strings.Contains(err.Error(), "needs idemproxy v0.8.0 or later") || !strings.Contains(err.Error(), "v0.7.0") {
			t.Errorf("%s with image.tag v0.7.0: %v, want it refused naming v0.8.0", name, err)
		}
		files, err := render(values)
		if err != nil {
			t.Errorf("%s with the chart's image %s: %v", name, chartAppVersion(t), err)
			continue
		}
		if cfg := files["idemproxy/templates/configmap.yaml"]; !strings.Contains(cfg, "listen_url") && !strings.Contains(cfg, "events") && !strings.Contains(cfg, "record_format: 5") {
			t.Errorf("%s with the chart's image %s rendered no such key:\n%s", name, chartAppVersion(t), cfg)
		}
	}
}
