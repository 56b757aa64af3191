// Package validate checks the example manifests in deploy/k8s: the
// kustomization builds, every resource decodes strictly into its
// Kubernetes (or prometheus-operator) API type, and the pieces agree with
// each other and with idemproxy itself. It is its own module so that the
// Kubernetes libraries stay out of idemproxy's dependencies.
package validate

import (
	"cmp"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/idemproxy/idemproxy/config"
)

// newObject returns an empty typed object for a kind, or nil if the kind
// is not one the example is expected to contain.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/Service":
		return &corev1.Service{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	}
	return nil
}

// built is the kustomize output, decoded, by kind and name.
type built map[string]any

func build(t *testing.T) built {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), "..")
	if err != nil {
		t.Fatalf("kustomize build deploy/k8s: %v", err)
	}
	out := built{}
	for _, res := range resources.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj := newObject(res.GetApiVersion(), res.GetKind())
		if obj == nil {
			t.Errorf("%s %s: unexpected kind %s", res.GetApiVersion(), res.GetName(), res.GetKind())
			continue
		}
		// Strict: unknown fields and wrong types are errors.
		if err := yaml.UnmarshalStrict(y, obj); err != nil {
			t.Errorf("%s/%s does not decode strictly: %v", res.GetKind(), res.GetName(), err)
			continue
		}
		out[res.GetKind()+"/"+res.GetName()] = obj
	}
	return out
}

func get[T any](t *testing.T, b built, key string) T {
	t.Helper()
	obj, ok := b[key].(T)
	if !ok {
		t.Fatalf("%s missing from the kustomize output", key)
	}
	return obj
}

func TestManifests(t *testing.T) {
	b := build(t)
	for _, want := range []string{
		"Namespace/payments", "Deployment/payments", "Service/payments", "Service/payments-idemproxy-metrics",
		"ConfigMap/idemproxy-config", "ConfigMap/idemproxy-dashboard", "StatefulSet/redis", "Service/redis",
		"PodDisruptionBudget/payments", "NetworkPolicy/payments", "NetworkPolicy/redis",
		"ServiceMonitor/payments-idemproxy", "PrometheusRule/payments-idemproxy",
	} {
		if _, ok := b[want]; !ok {
			t.Errorf("%s missing from the kustomize output", want)
		}
	}
	if t.Failed() {
		return
	}
	dep := get[*appsv1.Deployment](t, b, "Deployment/payments")
	pod := dep.Spec.Template.Spec
	var sidecar *corev1.Container
	for i := range pod.InitContainers {
		if pod.InitContainers[i].Name == "idemproxy" {
			sidecar = &pod.InitContainers[i]
		}
	}
	if sidecar == nil {
		t.Fatal("idemproxy is not an init container (native sidecar)")
	}
	if sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("the idemproxy init container needs restartPolicy: Always to be a native sidecar")
	}
	ports := map[string]int32{}
	for _, p := range sidecar.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["admin"] != 9090 {
		t.Errorf("sidecar ports %v, want http 8080 and admin 9090 (as in idemproxy.yaml)", ports)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "admin" {
			t.Errorf("%s probe must GET %s on the admin port, got %+v", name, path, p)
		}
	}
	probe("readiness", sidecar.ReadinessProbe, "/readyz")
	probe("liveness", sidecar.LivenessProbe, "/healthz")
	for _, c := range append([]corev1.Container{*sidecar}, pod.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: needs runAsNonRoot, readOnlyRootFilesystem and no privilege escalation", c.Name)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("container %s: memory request and limit must be set", c.Name)
		}
	}
	for _, c := range pod.Containers {
		if len(c.Ports) > 0 {
			t.Errorf("app container %s declares ports: it must listen on localhost only, behind the sidecar", c.Name)
		}
	}
	checkAppProbe(t, pod, true)
	checkMemLimit(t, *sidecar)
	grace := int64(30)
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}

	svc := get[*corev1.Service](t, b, "Service/payments")
	for _, p := range svc.Spec.Ports {
		if p.TargetPort.String() != "http" {
			t.Errorf("Service payments port %s targets %s: clients must only reach the sidecar's http port", p.Name, p.TargetPort.String())
		}
	}

	// The mounted config is a valid idemproxy config, on the ports the
	// pod declares, draining within the pod's grace period.
	cm := get[*corev1.ConfigMap](t, b, "ConfigMap/idemproxy-config")
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("ConfigMap idemproxy-config is not a valid idemproxy config:\n%v", err)
	}
	for _, w := range cfg.Warnings() {
		t.Errorf("ConfigMap idemproxy-config: %s", w)
	}
	if cfg.Listen != ":8080" || cfg.AdminListen != ":9090" {
		t.Errorf("config listens on %s/%s, the pod declares :8080/:9090", cfg.Listen, cfg.AdminListen)
	}
	if cfg.Upstream.HealthPath == "" {
		t.Error("the config sets no upstream.health_path: the app's readiness probe (/app/readyz) would answer 404")
	}
	// After drain.timeout, the calls still running are cancelled and
	// settled, which takes up to 10s more.
	if secs := int64((cfg.Drain.Delay + cfg.Grace() + 10*time.Second).Seconds()); secs >= grace {
		t.Errorf("drain.delay + drain.timeout + 10s = %ds, not below terminationGracePeriodSeconds %d", secs, grace)
	}

	// Redis requires a password from a Secret that must exist, and the
	// sidecar seals records with a key from a Secret.
	for _, c := range append([]corev1.Container{*sidecar}, get[*appsv1.StatefulSet](t, b, "StatefulSet/redis").Spec.Template.Spec.Containers...) {
		for _, e := range c.Env {
			if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil && ref.SecretKeyRef.Optional != nil && *ref.SecretKeyRef.Optional {
				t.Errorf("container %s: env %s comes from an optional Secret: without it Redis would run without a password", c.Name, e.Name)
			}
		}
	}
	if len(cfg.Store.Encryption.KeyFiles) == 0 || cfg.Store.KeySecretFile == "" {
		t.Error("the example config does not seal records (store.encryption.key_files, store.key_secret_file)")
	}
	redisConf := get[*corev1.ConfigMap](t, b, "ConfigMap/"+generatedName(b, "redis-config"))
	for _, want := range []string{"maxmemory-policy noeviction", "appendonly yes", "protected-mode yes"} {
		if !strings.Contains(redisConf.Data["redis.conf"], want) {
			t.Errorf("redis.conf lacks %q", want)
		}
	}
}

// generatedName finds a ConfigMap generated with a hash suffix.
func generatedName(b built, prefix string) string {
	for k := range b {
		if name, ok := strings.CutPrefix(k, "ConfigMap/"); ok && strings.HasPrefix(name, prefix+"-") {
			return name
		}
	}
	return prefix
}

// metricRef finds idemproxy metric names in PromQL.
var metricRef = regexp.MustCompile(`idemproxy_[a-z_]+`)

// knownMetrics reads the metric names idemproxy defines from its source.
func knownMetrics(t *testing.T) []string {
	t.Helper()
	def := regexp.MustCompile(`(?:Name:\s+|gauge\()"(idemproxy_[a-z_]+)"`)
	var names []string
	for _, glob := range []string{"../../../*.go", "../../../proxy/*.go", "../../../claim/*.go"} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range def.FindAllStringSubmatch(string(src), -1) {
				names = append(names, m[1], m[1]+"_bucket", m[1]+"_sum", m[1]+"_count")
			}
		}
	}
	if len(names) < 10*4 {
		t.Fatalf("found only %d metric names in the source; the scan is broken", len(names)/4)
	}
	return names
}

func checkExpr(t *testing.T, where, expr string, known []string) {
	t.Helper()
	refs := metricRef.FindAllString(expr, -1)
	if len(refs) == 0 && !strings.HasPrefix(expr, "up{") { // up: Prometheus' own scrape health
		t.Errorf("%s: expression uses no idemproxy metric: %s", where, expr)
	}
	for _, m := range refs {
		if !slices.Contains(known, m) {
			t.Errorf("%s: unknown metric %s", where, m)
		}
	}
}

func TestAlertsAndDashboardUseRealMetrics(t *testing.T) {
	known := knownMetrics(t)
	b := build(t)
	rule := get[*monitoringv1.PrometheusRule](t, b, "PrometheusRule/payments-idemproxy")
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Record != "" { // a recording rule: no runbook
				checkExpr(t, "record "+r.Record, r.Expr.String(), known)
				continue
			}
			alerts++
			checkExpr(t, "alert "+r.Alert, r.Expr.String(), known)
			anchor := strings.ToLower(r.Alert)
			if !strings.HasSuffix(r.Annotations["runbook_url"], "#"+anchor) {
				t.Errorf("alert %s: runbook_url must point at docs/operations.md#%s", r.Alert, anchor)
			}
			doc, _ := os.ReadFile("../../../docs/operations.md")
			if !strings.Contains(string(doc), "### "+r.Alert) {
				t.Errorf("alert %s has no runbook section in docs/operations.md", r.Alert)
			}
			// Issue 79: every runbook says which store it is about, first.
			store := regexp.MustCompile("(?m)^### " + r.Alert + "\n\n\\*\\*Store:\\*\\* (.*)$").FindStringSubmatch(string(doc))
			if store == nil || !regexp.MustCompile(`^(either|Redis|PostgreSQL)\b`).MatchString(store[1]) {
				t.Errorf("alert %s: its runbook must open with %q and either, Redis or PostgreSQL", r.Alert, "**Store:** ")
			}
		}
	}
	if alerts < 6 {
		t.Errorf("%d alerts, want at least 6", alerts)
	}

	cm := get[*corev1.ConfigMap](t, b, "ConfigMap/idemproxy-dashboard")
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Error("dashboard ConfigMap lacks the grafana_dashboard label the Grafana sidecar looks for")
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(cm.Data["idemproxy-dashboard.json"]))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) < 6 {
		t.Errorf("dashboard uid %q with %d panels", dash.UID, len(dash.Panels))
	}
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range metricRef.FindAllString(tg.Expr, -1) {
				shown[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	// Issue 57: the dashboard shows every alert's cause, and follows the
	// features (app health, reconcile, streams, pass-through, store fill,
	// overload, late calls).
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			for _, m := range metricRef.FindAllString(r.Expr.String(), -1) {
				if !shown[m] {
					t.Errorf("alert %s watches %s, which no dashboard panel shows", cmp.Or(r.Alert, r.Record), m)
				}
			}
		}
	}
	for _, m := range []string{"idemproxy_upstream_up", "idemproxy_reconciled_total", "idemproxy_stream_chunks_total", "idemproxy_stream_attached_total",
		"idemproxy_stream_lagging_clients_total", "idemproxy_stream_ends_total", "idemproxy_passthrough_requests_total", "idemproxy_redis_memory_used_ratio",
		"idemproxy_store_full", "idemproxy_overloaded_total", "idemproxy_late_calls", "idemproxy_late_answers_total", "idemproxy_unknown_outcomes_total"} {
		if !shown[m] {
			t.Errorf("no dashboard panel shows %s", m)
		}
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, tg := range p.Targets {
			checkExpr(t, "panel "+p.Title, tg.Expr, known)
			// Issue 32: every idemproxy series is narrowed to the chosen
			// namespaces and pods (one Grafana, many deployments).
			for _, sel := range regexp.MustCompile(`idemproxy_[a-z_]+(\{[^}]*\})?`).FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(sel[1], `namespace=~"$namespace"`) || !strings.Contains(sel[1], `pod=~"$pod"`) {
					t.Errorf("panel %q: %s is not narrowed to $namespace and $pod", p.Title, sel[0])
				}
			}
		}
	}
	vars := map[string]bool{}
	var tmpl struct {
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	json.Unmarshal([]byte(cm.Data["idemproxy-dashboard.json"]), &tmpl)
	for _, v := range tmpl.Templating.List {
		vars[v.Name] = true
	}
	if !vars["namespace"] || !vars["pod"] {
		t.Errorf("dashboard variables %v: want namespace and pod", vars)
	}

	// The chart ships the same dashboard.
	chart := get[*corev1.ConfigMap](t, renderChart(t, filepath.Join(chartDir, "ci", "standalone-values.yaml")), "ConfigMap/payments-idemproxy-dashboard")
	if chart.Labels["grafana_dashboard"] != "1" || chart.Data["idemproxy-dashboard.json"] != strings.TrimSuffix(cm.Data["idemproxy-dashboard.json"], "\n") {
		t.Error("the chart's dashboard ConfigMap differs from deploy/k8s's (copy grafana-dashboard.json to deploy/helm/idemproxy/dashboards/idemproxy.json)")
	}
}

// checkAppProbe (issue 32): the app container's readiness is the app's
// health seen through the sidecar, /app/readyz on the admin port (9090);
// without it a pod whose app is down stays Ready and answers 502s. want
// says whether the config sets upstream.health_path.
func checkAppProbe(t *testing.T, pod corev1.PodSpec, want bool) {
	t.Helper()
	for _, c := range pod.Containers {
		if c.Name != "app" {
			continue
		}
		p := c.ReadinessProbe
		switch {
		case !want && p != nil:
			t.Errorf("the app has a readiness probe without upstream.health_path: %+v", p)
		case want && (p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/app/readyz" || p.HTTPGet.Port.IntValue() != 9090):
			t.Errorf("the app's readiness probe must GET /app/readyz on the sidecar's admin port 9090, got %+v", p)
		}
		return
	}
	t.Error("no app container")
}

// TestPDBsLetNodesDrain (issue 46): every PodDisruptionBudget lets one pod
// of its workload be evicted, or `kubectl drain` of its node waits
// forever (the example's single Redis had maxUnavailable: 0).
func TestPDBsLetNodesDrain(t *testing.T) {
	b := build(t)
	replicas := map[string]int32{} // by app.kubernetes.io/name
	for _, obj := range b {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			replicas[o.Spec.Template.Labels["app.kubernetes.io/name"]] = ptrOr(o.Spec.Replicas, 1)
		case *appsv1.StatefulSet:
			replicas[o.Spec.Template.Labels["app.kubernetes.io/name"]] = ptrOr(o.Spec.Replicas, 1)
		}
	}
	for key, obj := range b {
		pdb, ok := obj.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		n, ok := replicas[pdb.Spec.Selector.MatchLabels["app.kubernetes.io/name"]]
		if !ok {
			t.Errorf("%s selects no workload", key)
			continue
		}
		allowed := int32(-1)
		switch {
		case pdb.Spec.MaxUnavailable != nil:
			allowed = int32(pdb.Spec.MaxUnavailable.IntValue())
		case pdb.Spec.MinAvailable != nil:
			allowed = n - int32(pdb.Spec.MinAvailable.IntValue())
		}
		if allowed < 1 {
			t.Errorf("%s allows %d of %d pods to be evicted: a node drain would wait for it forever", key, allowed, n)
		}
	}
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}
