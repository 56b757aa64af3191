package validate

import (
	"context"
	"fmt"
	"github.com/idemproxy/idemproxy/internal/poll"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// migrationValues is ci/postgres-migration-values.yaml.
var migrationValues = filepath.Join(chartDir, "ci", "postgres-migration-values.yaml")

// TestChartMigrationJob (issue 79): with postgres.migration, the chart runs
// `idemproxy store migrate -grant <runtime role>` as the schema's owner in
// a Job, and the config it reads in a ConfigMap, both Helm hooks that run
// before the release's pods are created or upgraded (the ConfigMap first);
// the owner's password is mounted where that config names it; the runtime
// role is the user of postgres.url. Without postgres.migration there is
// neither.
func TestChartMigrationJob(t *testing.T) {
	b := renderChart(t, migrationValues)
	job := get[*batchv1.Job](t, b, "Job/payments-idemproxy-migration")
	cm := get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-migration")
	for name, ann := range map[string]map[string]string{"Job": job.Annotations, "ConfigMap": cm.Annotations} {
		if ann["helm.sh/hook"] != "pre-install,pre-upgrade" || !strings.Contains(ann["helm.sh/hook-delete-policy"], "before-hook-creation") {
			t.Errorf("the migration %s's annotations %v: want a pre-install,pre-upgrade hook, replaced at each run", name, ann)
		}
	}
	if job.Annotations["helm.sh/hook-weight"] <= cm.Annotations["helm.sh/hook-weight"] {
		t.Errorf("hook weights: Job %q, ConfigMap %q: the ConfigMap must come first", job.Annotations["helm.sh/hook-weight"], cm.Annotations["helm.sh/hook-weight"])
	}
	pod := job.Spec.Template.Spec
	if len(pod.Containers) != 1 || pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatalf("the Job's pod: %d containers, restartPolicy %q", len(pod.Containers), pod.RestartPolicy)
	}
	c := pod.Containers[0]
	if want := []string{"store", "migrate", "-config", "/etc/idemproxy-migration/config.yaml", "-grant", "idemproxy"}; !slices.Equal(c.Args, want) {
		t.Errorf("the Job runs %q, want %q", c.Args, want)
	}
	if c.Image != "ghcr.io/idemproxy/idemproxy:"+chartAppVersion(t) {
		t.Errorf("the Job's image %s: want the chart's appVersion %s", c.Image, chartAppVersion(t))
	}
	cfg := loadRendered(t, cm)
	if p := cfg.Store.Postgres; p.URL != "postgres://idemproxy_owner@db-1.payments:5432/app?sslmode=verify-full" || p.PasswordFile != "/var/run/secrets/idemproxy-postgres-owner/password" || !p.CreateSchema {
		t.Errorf("the migration's store: %+v; want the owner's URL, its password file, create_schema", p)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || strings.HasPrefix(cfg.Store.Postgres.PasswordFile, m.MountPath+"/")
	}
	secret := slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == "idemproxy-postgres-owner"
	})
	if !mounted || !secret {
		t.Errorf("the owner's password: mounted where the config names it %t, from the owner's Secret %t", mounted, secret)
	}
	plain := renderChart(t, filepath.Join(chartDir, "ci", "postgres-values.yaml"))
	for _, k := range []string{"Job/payments-idemproxy-migration", "ConfigMap/payments-idemproxy-migration"} {
		if _, ok := plain[k]; ok {
			t.Errorf("%s rendered without postgres.migration", k)
		}
	}
}

// TestChartMigrationRollout (issue 79): the rollout the chart makes on an
// empty database with a runtime role that may create nothing
// (createSchema: false), run with real binaries: the Job's command and
// config as the owner, then a sidecar on the chart's config as the
// runtime role, which turns ready and serves; on the pinned release's
// binary (the image the chart runs) and on this tree's (the next one).
// Without the Job, this tree's sidecar never turns ready (v0.8.0's turned
// ready and answered every protected request 503).
func TestChartMigrationRollout(t *testing.T) {
	pinned, r := pinnedBinary(t)
	cur := binarytest.TestBinary(t)
	for _, tc := range []struct {
		name string
		bin  string
		job  bool
	}{{r.Version + " with the Job", pinned, true}, {"this tree with the Job", cur, true}, {"this tree without the Job", cur, false}} {
		t.Run(tc.name, func(t *testing.T) {
			pg := pgtest.Start(t)
			ctx := context.Background()
			if _, err := pg.Conn(t).Exec(ctx, "CREATE ROLE idemproxy_owner LOGIN; GRANT CREATE ON DATABASE postgres TO idemproxy_owner; CREATE ROLE app LOGIN"); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			password := filepath.Join(dir, "password")
			if err := os.WriteFile(password, []byte("unused: the test server trusts loopback\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			vals := filepath.Join(dir, "vals.yaml")
			url := func(role string) string {
				return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", role, pg.Addr)
			}
			if err := os.WriteFile(vals, fmt.Appendf(nil, "postgres:\n  url: %q\n  migration:\n    ownerUrl: %q\n", url("app"), url("idemproxy_owner")), 0o600); err != nil {
				t.Fatal(err)
			}
			b := renderChart(t, migrationValues, vals)
			// Where the pod mounts Secrets, this test has files.
			local := strings.NewReplacer("/var/run/secrets/idemproxy-postgres-owner/password", password, "/var/run/secrets/idemproxy-postgres/password", password)
			if tc.job {
				job := get[*batchv1.Job](t, b, "Job/payments-idemproxy-migration")
				cfg := filepath.Join(dir, "migration.yaml")
				if err := os.WriteFile(cfg, []byte(local.Replace(get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-migration").Data["config.yaml"])), 0o600); err != nil {
					t.Fatal(err)
				}
				args := slices.Clone(job.Spec.Template.Spec.Containers[0].Args)
				args[slices.Index(args, "-config")+1] = cfg
				out, err := exec.Command(tc.bin, args...).CombinedOutput()
				if err != nil || !strings.Contains(string(out), "installed") || !strings.Contains(string(out), `role "app" may use schema`) {
					t.Fatalf("the Job's command: %v\n%s", err, out)
				}
				t.Logf("the Job's log: %s", out)
			}
			text := local.Replace(get[*corev1.ConfigMap](t, b, "ConfigMap/payments-idemproxy-config").Data["config.yaml"])
			up := binarytest.NewRecorder(t)
			sc := binarytest.StartT(t, tc.bin, sidecarConfig(text, up.URL), binarytest.Options{Live: true})
			readyz := func() int {
				resp, err := http.Get(sc.Admin + "/readyz")
				if err != nil {
					return 0
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if !tc.job {
				// Readiness turns only when a preload succeeds, which
				// cannot happen without the schema: one look after the
				// first failed one is the answer.
				poll.Until(t, "the sidecar finds no schema", func() bool { return strings.Contains(sc.Logs(), "store not ready at start") })
				if st := readyz(); st != http.StatusServiceUnavailable {
					t.Fatalf("without the Job: /readyz %d on a database without its schema, want 503:\n%s", st, sc.Logs())
				}
				return
			}
			poll.Until(t, "the sidecar ready", func() bool { return readyz() == http.StatusOK })
			if status, body := binarytest.Post(t, sc.Client+"/payments", "rollout-1", `{}`); status != http.StatusCreated {
				t.Errorf("a first attempt after the rollout: %d %s", status, body)
			}
		})
	}
}

// sidecarConfig is the chart's rendered config, run here: its listeners
// left to the harness (which adds free loopback ones), its upstream the
// test's.
func sidecarConfig(text, upstream string) string {
	var out []string
	skip := false
	for line := range strings.Lines(text) {
		top := !strings.HasPrefix(line, " ")
		if top {
			skip = strings.HasPrefix(line, "listen:") || strings.HasPrefix(line, "admin_listen:") || strings.HasPrefix(line, "upstream:")
		}
		if !skip {
			out = append(out, line)
		}
	}
	return strings.Join(out, "") + fmt.Sprintf("upstream:\n  url: %q\n", upstream)
}
