package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/idemproxy/idemproxy/config"
)

const chartDir = "../../helm/idemproxy"

// renderChart renders the chart with a values file, as helm template does,
// and strictly decodes every manifest into its API type.
func renderChart(t *testing.T, valuesFile string, more ...string) built {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals, err := chartutil.ReadValuesFile(valuesFile)
	if err != nil {
		t.Fatalf("%s: %v", valuesFile, err)
	}
	for _, f := range more { // later files win, as helm -f a -f b
		next, err := chartutil.ReadValuesFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vals = chartutil.CoalesceTables(next, vals)
	}
	return render(t, chrt, vals, "payments")
}

// render renders chrt with vals as release (in a namespace of that name),
// as helm template does, and strictly decodes every manifest.
func render(t *testing.T, chrt *chart.Chart, vals chartutil.Values, release string) built {
	t.Helper()
	if err := chartutil.ProcessDependencies(chrt, vals); err != nil {
		t.Fatalf("dependencies of %s: %v", chrt.Name(), err)
	}
	rv, err := chartutil.ToRenderValues(chrt, vals, chartutil.ReleaseOptions{Name: release, Namespace: release, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		t.Fatalf("render %s: %v", chrt.Name(), err)
	}
	out := built{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for doc := range strings.SplitSeq(files[name], "\n---") {
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if meta.Kind == "" {
				continue // a template rendered empty
			}
			obj := newObject(meta.APIVersion, meta.Kind)
			if obj == nil {
				t.Errorf("%s: unexpected kind %s/%s", name, meta.APIVersion, meta.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s (%s/%s) does not decode strictly: %v", name, meta.Kind, meta.Metadata.Name, err)
				continue
			}
			out[meta.Kind+"/"+meta.Metadata.Name] = obj
		}
	}
	return out
}

// TestHelmChart renders the chart with every values file in its ci/
// directory: each must lint, render, decode strictly, carry an idemproxy
// config that idemproxy itself loads, and mount every volume it uses.
func TestHelmChart(t *testing.T) {
	valuesFiles, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if len(valuesFiles) < 4 {
		t.Fatalf("found %d values files in the chart's ci/ directory, want at least 4", len(valuesFiles))
	}
	for _, vf := range valuesFiles {
		t.Run(filepath.Base(vf), func(t *testing.T) {
			vals, err := chartutil.ReadValuesFile(vf)
			if err != nil {
				t.Fatal(err)
			}
			linter := lint.AllWithKubeVersion(chartDir, vals, "payments", nil)
			for _, m := range linter.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
			b := renderChart(t, vf)
			cm := get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-config")
			cfg := loadRendered(t, cm)
			if len(cfg.Store.Redis.Addrs) == 0 && cfg.Store.Postgres.URL == "" {
				t.Error("the rendered config has neither a Redis address nor a PostgreSQL URL: it would run on the embedded store")
			}
			for _, kind := range []string{"Service/payments-idemproxy", "Service/payments-idemproxy-metrics"} {
				if _, ok := b[kind]; !ok {
					t.Errorf("%s missing", kind)
				}
			}
			dep, ok := b["Deployment/payments-idemproxy"].(*appsv1.Deployment)
			if !ok {
				if vals["app"] == nil {
					t.Error("no Deployment with the default app.enabled")
				}
				return
			}
			checkPod(t, dep.Spec.Template.Spec, cfg)
			checkAppProbe(t, dep.Spec.Template.Spec, cfg.Upstream.HealthPath != "")
		})
	}
}

// checkPod: the sidecar is a native sidecar on idemproxy's ports, every
// volume it mounts exists, and every file the config names is mounted.
func checkPod(t *testing.T, pod corev1.PodSpec, cfg *config.Config) {
	t.Helper()
	if len(pod.InitContainers) != 1 || pod.InitContainers[0].Name != "idemproxy" {
		t.Fatal("idemproxy is not the init container")
	}
	sidecar := pod.InitContainers[0]
	checkMemLimit(t, sidecar)
	if sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("the sidecar needs restartPolicy: Always")
	}
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = true
	}
	var mounted []string
	for _, m := range sidecar.VolumeMounts {
		if !volumes[m.Name] {
			t.Errorf("the sidecar mounts %s, which the pod does not define", m.Name)
		}
		mounted = append(mounted, m.MountPath)
	}
	files := append([]string{cfg.Store.Redis.PasswordFile, cfg.Store.Redis.SentinelPasswordFile, cfg.Store.KeySecretFile, cfg.Admin.TokenFile}, cfg.Store.Encryption.KeyFiles...)
	for _, r := range cfg.Routes {
		files = append(files, r.Webhook.SecretFiles...)
	}
	for _, f := range files {
		if f != "" && !slices.ContainsFunc(mounted, func(dir string) bool { return strings.HasPrefix(f, dir+"/") }) {
			t.Errorf("the config names %s, which no volume mount provides", f)
		}
	}
}

// TestHelmAlertsMatchKustomize: the chart's PrometheusRule carries the same
// rules as the kustomize example's, which TestAlertsAndDashboardUseRealMetrics
// checks against idemproxy's metrics.
func TestHelmAlertsMatchKustomize(t *testing.T) {
	chart := get[*monitoringv1.PrometheusRule](t, renderChart(t, filepath.Join(chartDir, "ci", "standalone-values.yaml")), "PrometheusRule/payments-idemproxy")
	kustomize := get[*monitoringv1.PrometheusRule](t, build(t), "PrometheusRule/payments-idemproxy")
	if !reflect.DeepEqual(chart.Spec, kustomize.Spec) {
		t.Error("the chart's alert rules differ from deploy/k8s/prometheusrule.yaml")
	}
}

// loadRendered loads the idemproxy config a rendered ConfigMap holds with
// idemproxy's own loader, failing t when idemproxy would refuse it.
func loadRendered(t *testing.T, cm *corev1.ConfigMap) *config.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("idemproxy refuses the rendered config: %v\n%s", err, cm.Data["config.yaml"])
	}
	return cfg
}

// TestChartRecordFormat (issue 31): a chart install with a key secret
// writes keyed fingerprints (store.record_format: 2), unless
// encryption.recordFormat holds 1 while older pods still run; and a config
// asking for format 2 without a key secret is refused at render time, as
// idemproxy itself refuses it. Before, the chart never set the format:
// sealed installs kept plain SHA-256 fingerprints.
func TestChartRecordFormat(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := filepath.Join(chartDir, "ci", "standalone-values.yaml")
	format := func(b built) int {
		return loadRendered(t, get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-config")).Store.RecordFormat
	}
	if got := format(renderChart(t, base)); got != 2 {
		t.Errorf("sealed install with a key secret: record_format %d, want 2", got)
	}
	if got := format(renderChart(t, base, write("hold.yaml", "encryption:\n  recordFormat: 1\n"))); got != 1 {
		t.Errorf("encryption.recordFormat: 1: record_format %d, want 1 (held during an upgrade)", got)
	}
	if got := format(renderChart(t, filepath.Join(chartDir, "ci", "minimal-values.yaml"))); got != 1 {
		t.Errorf("no key secret: record_format %d, want 1", got)
	}
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValuesFile(write("bad.yaml", "config:\n  store:\n    record_format: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(chrt, vals, chartutil.ReleaseOptions{Name: "payments", Namespace: "payments", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Render(chrt, rv); err == nil || !strings.Contains(err.Error(), "record_format 2") {
		t.Errorf("record_format 2 without a key secret rendered: %v, want it refused", err)
	}

	// Issue 57: formats 3 (compact, compressed) and 4 (streams) need no key
	// secret, with or without sealing, as idemproxy itself says; with a key
	// secret, encryption.recordFormat writes them too. Each render is
	// loaded by idemproxy's own loader (what -check runs).
	for _, f := range []int{1, 3, 4} {
		one := write(fmt.Sprintf("format-%d.yaml", f), fmt.Sprintf("config:\n  store:\n    record_format: %d\n", f))
		if got := format(renderChart(t, filepath.Join(chartDir, "ci", "minimal-values.yaml"), one)); got != f {
			t.Errorf("config.store.record_format %d without sealing: rendered %d", f, got)
		}
		sealedNoSecret := write(fmt.Sprintf("sealed-%d.yaml", f), "encryption:\n  keySecretKey: \"\"\n")
		if got := format(renderChart(t, base, sealedNoSecret, one)); got != f {
			t.Errorf("config.store.record_format %d, sealed without a key secret: rendered %d", f, got)
		}
	}
	for _, f := range []int{2, 3, 4} {
		with := write(fmt.Sprintf("with-secret-%d.yaml", f), fmt.Sprintf("encryption:\n  recordFormat: %d\n", f))
		if got := format(renderChart(t, base, with)); got != f {
			t.Errorf("encryption.recordFormat %d with a key secret: rendered %d", f, got)
		}
	}
}

// TestChartPortsFollowTheConfig (issue 46): with other config.listen and
// config.admin_listen ports, the container ports, the probes, the
// Service's target ports, the app's readiness probe and the NetworkPolicy
// all follow: a Service sending traffic to a port nothing listens on, or
// a startup probe on the wrong port, was the bug.
func TestChartPortsFollowTheConfig(t *testing.T) {
	b := renderChart(t, filepath.Join(chartDir, "ci", "standalone-values.yaml"), filepath.Join("testdata", "ports-values.yaml"))
	cfg := loadRendered(t, get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-config"))
	if cfg.Listen != ":8181" || cfg.AdminListen != "0.0.0.0:9191" {
		t.Fatalf("rendered config listens on %q and %q", cfg.Listen, cfg.AdminListen)
	}
	// Issue 57: NOTES.txt says the ports too (it said 8080 and 9090).
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "ci", "standalone-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ports, err := chartutil.ReadValuesFile(filepath.Join("testdata", "ports-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(chrt, chartutil.CoalesceTables(ports, vals), chartutil.ReleaseOptions{Name: "payments", Namespace: "payments", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		t.Fatal(err)
	}
	notes := files["idemproxy/templates/NOTES.txt"]
	if !strings.Contains(notes, "port 8181") || !strings.Contains(notes, "localhost:9191/readyz") || strings.Contains(notes, "8080") || strings.Contains(notes, "9090") {
		t.Errorf("NOTES.txt does not follow the config's ports (8181, 9191):\n%s", notes)
	}
	dep := get[*appsv1.Deployment](t, b, "Deployment/payments-idemproxy")
	pod := dep.Spec.Template.Spec
	named := map[string]int32{}
	for _, c := range pod.InitContainers {
		if c.Name != "idemproxy" {
			continue
		}
		for _, p := range c.Ports {
			named[p.Name] = p.ContainerPort
		}
		for name, pr := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Port.String() != "admin" && pr.HTTPGet.Port.IntValue() != 9191 {
				t.Errorf("sidecar %s probe on port %s, want admin (9191)", name, pr.HTTPGet.Port.String())
			}
		}
	}
	if named["http"] != 8181 || named["admin"] != 9191 {
		t.Errorf("sidecar container ports %v, want http 8181 and admin 9191", named)
	}
	for _, c := range pod.Containers {
		if pr := c.ReadinessProbe; pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Path == "/app/readyz" && pr.HTTPGet.Port.IntValue() != 9191 {
			t.Errorf("the app's readiness probe on /app/readyz port %s, want 9191", pr.HTTPGet.Port.String())
		}
	}
	for key, obj := range b {
		switch o := obj.(type) {
		case *corev1.Service:
			for _, p := range o.Spec.Ports {
				if tp := p.TargetPort.String(); tp != "http" && tp != "admin" && p.TargetPort.IntValue() != 8181 && p.TargetPort.IntValue() != 9191 {
					t.Errorf("%s targets port %s, which the sidecar does not listen on", key, tp)
				}
			}
		case *networkingv1.NetworkPolicy:
			var ports []int
			for _, rule := range o.Spec.Ingress {
				for _, p := range rule.Ports {
					ports = append(ports, p.Port.IntValue())
				}
			}
			if !slices.Contains(ports, 8181) || !slices.Contains(ports, 9191) || slices.Contains(ports, 8080) || slices.Contains(ports, 9090) {
				t.Errorf("%s admits ports %v, want 8181 and 9191 (and not 8080, 9090)", key, ports)
			}
		}
	}
}

// TestChartPostgres (issue 56): with postgres.url the chart renders
// store.postgres (schema, create_schema, max_conns, the password file of
// postgres.existingSecret, mounted) and no store.redis, which idemproxy
// would refuse beside it; the NetworkPolicy lets the sidecar reach the
// database's port instead of Redis'. The rendered config loads with
// idemproxy's own loader.
func TestChartPostgres(t *testing.T) {
	dir := t.TempDir()
	pg := filepath.Join(dir, "pg.yaml")
	if err := os.WriteFile(pg, []byte("postgres:\n  url: \"postgres://idemproxy@db:5432/app?sslmode=verify-full\"\n  existingSecret: pg-secret\n  maxConns: 16\nnetworkPolicy:\n  enabled: true\n  egress: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := renderChart(t, filepath.Join(chartDir, "ci", "minimal-values.yaml"), pg)
	cfg := loadRendered(t, get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-config"))
	p := cfg.Store.Postgres
	if p.URL != "postgres://idemproxy@db:5432/app?sslmode=verify-full" || p.PasswordFile != "/var/run/secrets/idemproxy-postgres/password" || p.MaxConns != 16 || p.Schema != "idemproxy" || !p.CreateSchema || len(cfg.Store.Redis.Addrs) != 0 {
		t.Errorf("rendered store: postgres %+v, redis addrs %v; want the postgres values and no redis", p, cfg.Store.Redis.Addrs)
	}
	dep := get[*appsv1.Deployment](t, b, "Deployment/payments-idemproxy")
	found := false
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "pg-secret" {
			found = true
		}
	}
	if !found {
		t.Error("postgres.existingSecret is not mounted")
	}
	np := get[*networkingv1.NetworkPolicy](t, b, "NetworkPolicy/payments-idemproxy")
	ports := map[int32]bool{}
	for _, e := range np.Spec.Egress {
		for _, port := range e.Ports {
			if port.Port != nil {
				ports[port.Port.IntVal] = true
			}
		}
	}
	if !ports[5432] || ports[6379] {
		t.Errorf("egress ports %v: want PostgreSQL's 5432, not Redis' 6379", ports)
	}
}
