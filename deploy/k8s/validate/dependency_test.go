package validate

import (
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// renderParent renders testdata/parent, a user's chart that vendors
// idemproxy as a dependency (attached here as `helm dependency build`
// would put it in charts/), as release "shop".
func renderParent(t *testing.T, overrides string) built {
	t.Helper()
	parent, err := loader.Load("testdata/parent")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	parent.AddDependency(sub)
	vals, err := chartutil.ReadValuesFile("testdata/parent/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if overrides != "" {
		more, err := chartutil.ReadValues([]byte(overrides))
		if err != nil {
			t.Fatal(err)
		}
		vals = chartutil.CoalesceTables(more, vals)
	}
	return render(t, parent, vals, "shop")
}

// TestHelmChartAsDependency: the chart vendored by another chart, whose
// own Deployment includes the sidecar, renders a pod that would start:
// every volume the sidecar mounts exists, every ConfigMap and Secret a
// volume names is rendered, the rendered config loads in idemproxy and
// names only mounted files, the image is idemproxy's, the sidecar has its
// own seccomp profile; and the Services, PodDisruptionBudget and
// NetworkPolicy of the subchart select the parent's pods.
func TestHelmChartAsDependency(t *testing.T) {
	b := renderParent(t, "")
	dep := get[*appsv1.Deployment](t, b, "Deployment/shop-orders")
	pod := dep.Spec.Template
	cm := get[*corev1.ConfigMap](t, b, "ConfigMap/shop-idemproxy-config")
	cfg := loadRendered(t, cm)
	checkPod(t, pod.Spec, cfg)
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.ConfigMap != nil:
			if _, ok := b["ConfigMap/"+v.ConfigMap.Name]; !ok {
				t.Errorf("volume %s names ConfigMap %s, which is not rendered", v.Name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			if _, ok := b["Secret/"+v.Secret.SecretName]; !ok {
				t.Errorf("volume %s names Secret %s, which is not rendered", v.Name, v.Secret.SecretName)
			}
		}
	}
	// Issue 57: the app's readiness through the sidecar, as the chart's
	// README shows it.
	for _, c := range pod.Spec.Containers {
		if p := c.ReadinessProbe; c.Name == "orders" && (p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/app/readyz" || p.HTTPGet.Port.IntValue() != 9090) {
			t.Errorf("the parent's app container has no readiness probe on the sidecar's /app/readyz (9090): %+v", p)
		}
	}
	sidecar := pod.Spec.InitContainers[0]
	if want := ":" + chartAppVersion(t); !strings.HasSuffix(sidecar.Image, want) {
		t.Errorf("sidecar image %s: want idemproxy's appVersion %s, not the parent's", sidecar.Image, want[1:])
	}
	if sc := sidecar.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the sidecar container has no seccompProfile of its own; the parent's pod sets none")
	}
	if pod.Annotations["checksum/idemproxy-config"] == "" {
		t.Error("the parent's pod has no checksum/idemproxy-config annotation")
	}
	podLabels := labels.Set(pod.Labels)
	for _, key := range []string{"Service/shop-idemproxy", "Service/shop-idemproxy-metrics"} {
		svc := get[*corev1.Service](t, b, key)
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("%s selects %v; the parent's pods have %v", key, svc.Spec.Selector, pod.Labels)
		}
	}
	pdb := get[*policyv1.PodDisruptionBudget](t, b, "PodDisruptionBudget/shop-idemproxy")
	if !labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(podLabels) {
		t.Errorf("the PodDisruptionBudget selects %v; the parent's pods have %v", pdb.Spec.Selector.MatchLabels, pod.Labels)
	}
	np := get[*networkingv1.NetworkPolicy](t, b, "NetworkPolicy/shop-idemproxy")
	if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(podLabels) {
		t.Errorf("the NetworkPolicy selects %v; the parent's pods have %v", np.Spec.PodSelector.MatchLabels, pod.Labels)
	}
	sm := get[*monitoringv1.ServiceMonitor](t, b, "ServiceMonitor/shop-idemproxy")
	metrics := get[*corev1.Service](t, b, "Service/shop-idemproxy-metrics")
	if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(metrics.Labels)) {
		t.Errorf("the ServiceMonitor selects %v; the metrics Service has %v", sm.Spec.Selector.MatchLabels, metrics.Labels)
	}
}

// TestChartNetworkPolicyEgress: egress is not restricted unless
// networkPolicy.egress; when it is, Redis (the sentinels' port on
// Sentinel, never a Cluster's bus port), DNS, the OTLP collector (by
// namespace), the JWKS URL and the in-cluster authorizer and extraEgress
// are allowed.
func TestChartNetworkPolicyEgress(t *testing.T) {
	ingressOnly := get[*networkingv1.NetworkPolicy](t, renderParent(t, "idemproxy: {networkPolicy: {egress: false}}"), "NetworkPolicy/shop-idemproxy")
	for _, pt := range ingressOnly.Spec.PolicyTypes {
		if pt == networkingv1.PolicyTypeEgress {
			t.Error("egress restricted although networkPolicy.egress is false: the app would lose its own egress")
		}
	}
	np := get[*networkingv1.NetworkPolicy](t, renderParent(t, ""), "NetworkPolicy/shop-idemproxy")
	type rule struct {
		ns   string
		port int32
	}
	var got []rule
	for _, e := range np.Spec.Egress {
		ns := "*"
		for _, peer := range e.To {
			switch {
			case peer.NamespaceSelector != nil:
				ns = peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]
			case peer.PodSelector != nil:
				ns = "pods:" + peer.PodSelector.MatchLabels["app.kubernetes.io/name"]
			}
		}
		for _, p := range e.Ports {
			got = append(got, rule{ns, p.Port.IntVal})
		}
	}
	has := func(r rule) bool {
		for _, g := range got {
			if g == r {
				return true
			}
		}
		return false
	}
	for _, want := range []rule{
		{"pods:redis", 6379}, {"pods:redis", 26379}, // sentinel mode
		{"kube-system", 53},
		{"observability", 4318}, // OTEL_EXPORTER_OTLP_ENDPOINT
		{"*", 443},              // the JWKS URL, outside the cluster
		{"security", 8181},      // the replay authorizer
		{"inventory", 8080},     // extraEgress
	} {
		if !has(want) {
			t.Errorf("egress lacks %v; got %v", want, got)
		}
	}
	if has(rule{"pods:redis", 16379}) {
		t.Error("egress opens a Cluster's bus port, which no client uses")
	}
}

// TestChartChecksumCoversRestartOnly: a route-only change (routes reload
// in place) keeps the pods' checksum, so nothing rolls; a restart-only
// change (upstream.timeout) changes it.
func TestChartChecksumCoversRestartOnly(t *testing.T) {
	sum := func(overrides string) string {
		dep := get[*appsv1.Deployment](t, renderParent(t, overrides), "Deployment/shop-orders")
		return dep.Spec.Template.Annotations["checksum/idemproxy-config"]
	}
	base := sum("")
	if routes := sum(`idemproxy: {config: {routes: [{name: create-order, match: "POST /orders"}, {name: refund, match: "POST /refunds"}]}}`); routes != base {
		t.Error("a route-only change rolls the pods, although routes reload without a restart")
	}
	if defaults := sum(`idemproxy: {config: {defaults: {lease: 20s}}}`); defaults != base {
		t.Error("a change of defaults rolls the pods, although defaults reload without a restart")
	}
	if timeout := sum(`idemproxy: {config: {upstream: {url: "http://127.0.0.1:3000", timeout: 45s}}}`); timeout == base {
		t.Error("a change of upstream.timeout (restart-only) does not roll the pods")
	}
}
