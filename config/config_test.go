package config_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
)

// TestInvalidFixtures loads one file per failure mode and asserts the
// whole list of problems, each named by its YAML path.
func TestInvalidFixtures(t *testing.T) {
	tests := map[string][]string{
		"bad_clients": {
			`defaults.problem_body: renders invalid JSON for application/json on a sample problem: {"error": {"type": "key-reused", "message": a "quoted" detail with a \ backslash}}`,
			`defaults.in_progress_status: must be 409, 429 or 503, got 418`,
			`defaults.stream_flush_interval: must be between 0s (each read stored and sent at once) and 1s, got 2s`,
			`defaults.key_json_pointer: "request_id" is not a JSON Pointer: it must start with /`,
			`routes[0].problem_body: template: problem_body:1: unclosed action`,
			`routes[1].problem_content_type: goes with problem_body, which is empty`,
		},
		"section_as_value": {
			`upstream: must be a mapping (with health_path, late_answer_window, late_calls_principal_share, max_late_calls, timeout, url), got a single value`,
			`store.redis: must be a mapping (with addrs, master_name, password, password_file, sentinel_password, sentinel_password_file, sentinel_username, tls, tls_ca_file, tls_server_name, username), got a single value`,
		},
		"case_twins": {
			`listen: given twice, as "listen" and "LISTEN": keys are matched without regard to case, so one of them would be ignored`,
			`upstream.timeout: given twice, as "Timeout" and "timeout": keys are matched without regard to case, so one of them would be ignored`,
		},
		"unknown_key": {
			`defaults.leese: unknown key`,
			`upstream.timout: unknown key`,
			`routes[0].retension: unknown key`,
		},
		"bad_duration": {
			`defaults.lease: must be a duration with a unit, like 10s or 24h, got "banana"`,
			`routes[0].retention: must be a duration with a unit, like 10s or 24h, got 10`,
		},
		"bad_size": {
			`defaults.max_request_body: must be a size like 512KiB, 1MiB, 1GiB or a number of bytes, got "banana"`,
			`routes[0].max_response_body: must be a size like 512KiB, 1MiB, 1GiB or a number of bytes, got "1MB"`,
		},
		"lease_too_short": {
			`routes[0].lease: must be at least 1s, got 500ms`,
		},
		"retention_shorter_than_lease": {
			`routes[0].retention: must not be shorter than lease (30s), got 10s`,
		},
		"duplicate_route": {
			`routes[1].name: duplicate route name "pay" (also routes[0])`,
		},
		"bad_pattern": {
			`routes[0].match: must be a method and a path, like "POST /payments", got "/payments"`,
			`routes[1].match: parsing "POST /orders/{id": at offset 13: bad wildcard segment (must end with '}')`,
			`routes[2].match: "POST /payments/" ends in /, which matches a whole subtree; name the exact path (or end it with {$})`,
			`routes[4].match: pattern "POST /payments" conflicts with pattern "POST /payments": POST /payments matches the same requests as POST /payments`,
			`routes[5].match: pattern "POST /payments" conflicts with pattern "POST /payments": POST /payments matches the same requests as POST /payments`,
			`routes[6].match: "POST /payments?currency=eur" contains "?": a route matches the path only, never the query or fragment`,
			`routes[7].match: "POST /orders#new" contains "#": a route matches the path only, never the query or fragment`,
			`routes[8].match: "POST /" matches every path; use "/{$}" for the root only, or "/{path...}" to protect everything`,
		},
		"bad_status": {
			`defaults.release_on[1]: must be an HTTP status between 100 and 599, got 600`,
			`routes[0].release_on[0]: must be an HTTP status between 100 and 599, got 99`,
			`routes[0].release_on[1]: must be an HTTP status code, got "abc"`,
		},
		"bad_enum": {
			`log_level: must be one of debug, info, warn, error, got "verbose"`,
			`defaults.scope: must be one of route, principal, got "global"`,
			`defaults.concurrent: must be one of reject, wait, got "queue"`,
			`routes[0].unknown_outcome: must be one of keep, release, fail, got "retry"`,
			`routes[0].store_unavailable: must be one of fail_closed, fail_open, got "ignore"`,
		},
		"bad_identity": {
			`identity.header: must not be empty`,
			`identity.trusted_proxies[0]: "10.0.0.0/33" is not a CIDR prefix`,
			`identity.trusted_proxies[1]: "not-an-ip" is not an IP address or CIDR prefix`,
		},
		"bad_pointer": {
			`routes[0].fingerprint.ignore_json_fields[0]: "attempt" is not a JSON Pointer: it must start with /`,
			`routes[0].fingerprint.ignore_json_fields[1]: "/a~2b" is not a JSON Pointer: ~ must be followed by 0 or 1`,
		},
		"bad_upstream": {
			`upstream.url: must be an absolute http or https URL, got "127.0.0.1:3000"`,
			`upstream.timeout: must be positive, got 0s`,
		},
		"bad_jwt": {
			`identity.jwt.jwks_url: must be an absolute http or https URL with identity.source jwt, got "issuer.example/jwks"`,
			`identity.jwt.issuer: must be set with identity.source jwt: tokens of any other issuer are refused`,
			`identity.jwt.audience: must list at least one audience with identity.source jwt: a token meant for another service must not be accepted`,
		},
		"bad_pprof": {
			`admin_pprof: removed: pprof is served only on its own loopback listener; set admin_pprof_listen: 127.0.0.1:6060`,
			`admin_pprof_listen: ":6060" is not a loopback address: pprof's profiles and heap dumps hold request contents; use 127.0.0.1:6060 or [::1]:6060 and reach it with kubectl port-forward`,
		},
		"bad_late_answers": {
			`upstream.late_answer_window: must not be negative (0s cancels the upstream call at upstream.timeout), got -1s`,
			`upstream.max_late_calls: must not be negative, got -5`,
		},
		"upstream_loop": {
			`upstream.url: "http://localhost:8080/api" is idemproxy's own listen (:8080): every request would loop back into the proxy; point it at the app`,
		},
		"upstream_loop_admin": {
			`upstream.url: "http://127.0.0.1:9090" is idemproxy's own admin_listen (127.0.0.1:9090): every request would loop back into the proxy; point it at the app`,
		},
		"bad_sentinel_auth": {
			`store.redis.sentinel_username: is only used with Sentinel: set store.redis.master_name, or remove it`,
			`store.redis.sentinel_password_file: is only used with Sentinel: set store.redis.master_name, or remove it`,
		},
		"bad_sentinel_both": {
			`store.redis.sentinel_password_file: set either store.redis.sentinel_password or store.redis.sentinel_password_file, not both`,
		},
		"bad_store": {
			`store.redis.password_file: set either store.redis.password or store.redis.password_file, not both`,
			`store.wait_timeout: must be positive when store.wait_replicas is set, got 0s`,
		},
		"record_format_without_secret": {
			`store.record_format: 2 keys fingerprints with store.key_secret_file (never a sealing key, which rotates), which is not set: set it, or keep 1`,
		},
		"bad_addresses": {
			`listen: must be host:port (e.g. :8080, 127.0.0.1:8080, redis:6379), got "8080"`,
			`admin_listen: must be host:port with a port from 0 to 65535, got "localhost:http"`,
			`store.redis.addrs[1]: must be host:port (e.g. :8080, 127.0.0.1:8080, redis:6379), got "redis"`,
		},
		"bad_webhook": {
			`routes[0].webhook.secret_files: must name at least one file holding the provider's signing secret`,
			`routes[0].webhook.tolerance: must be between 1s and 1h (a signed timestamp further off is refused: replay protection), got 2h0m0s`,
			`routes[1].webhook.provider: must be one of stripe, github, shopify, standard, got "paypal"`,
			`routes[2].webhook.provider: must be set with secret_files: stripe, github, shopify or standard`,
			`routes[3].webhook.events[1]: "Push" is not a github event name as github writes it (^[a-z_]+$)`,
			`routes[4].webhook.events: applies to github and shopify, whose event is not signed; stripe signs what keys its deliveries`,
		},
		"bad_reconcile": {
			`routes[0].reconcile.url: must carry {key}, or every key would get the same answer: "/payments/by-key"`,
			`routes[1].reconcile.absent: status 404 is also in found: one answer cannot say both`,
			`routes[1].reconcile.absent_after: must be at least upstream.timeout + upstream.late_answer_window (5m30s), the longest a request runs in the app, got 1m0s: an absent answer before then may be a request still running`,
			`routes[1].reconcile.timeout: must be between 1ms and 1m, got 2m0s`,
			`routes[1].reconcile.url: only {key}, {principal} and {route} are replaced: "/payments/{key}?who={user}"`,
			`routes[2].reconcile.absent_after: must be shorter than the route's retention (24h0m0s), or an absent answer is never believed, got 48h0m0s`,
			`routes[2].reconcile.status: must be 0 (the default: 201 for a lookup's 200 on a POST route, else the lookup's) or an HTTP status between 200 and 599, got 99`,
			`routes[2].reconcile.url: must be a path on upstream.url starting with /, got "http://elsewhere/{key}"`,
			`routes[3].reconcile.url: a webhook route cannot reconcile: its provider, not the upstream, decides what a redelivery means`,
		},
		"bad_protocol": {
			`routes[0].protocol: must be one of http, grpc, connect, got "grcp"`,
			`routes[1].grpc: applies to protocol: grpc routes only`,
			`routes[2].grpc.key_field: must be a protobuf field number (1 to 536870911), or 0 for none, got -1`,
			`routes[2].grpc.release_codes[1]: must be a gRPC status name other than OK (UNAVAILABLE, RESOURCE_EXHAUSTED, ...), got "OK"`,
			`routes[2].grpc.release_codes[2]: must be a gRPC status name other than OK (UNAVAILABLE, RESOURCE_EXHAUSTED, ...), got "unavailable"`,
			`routes[2].reconcile.url: is not offered on protocol: grpc routes yet: an unknown outcome there follows unknown_outcome`,
			`routes[2].key_json_pointer: reads a JSON body: on a protocol: grpc route set grpc.key_field`,
		},
		"routes_not_list": {
			`routes: must be a list of routes, got a mapping`,
		},
	}
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		if _, ok := tests[name]; !ok && !strings.HasPrefix(name, "valid") {
			t.Errorf("fixture %s has no expected messages", f)
		}
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := config.Load(filepath.Join("testdata", name+".yaml"))
			if err == nil {
				t.Fatal("loaded without error")
			}
			got := strings.Split(err.Error(), "\n")
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestMinimalConfigTakesDefaults(t *testing.T) {
	c, err := config.Load("testdata/valid_minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}}
	if !reflect.DeepEqual(c.Defaults, want.Defaults) || !reflect.DeepEqual(c.Routes[0].Settings, want.Routes[0].Settings) ||
		c.Listen != want.Listen || c.Identity.Header != want.Identity.Header || !slices.Equal(c.Identity.TrustedProxies, want.Identity.TrustedProxies) {
		t.Errorf("loaded %+v\nwant defaults %+v", c, want)
	}
}

func TestExampleInheritsAndOverrides(t *testing.T) {
	c, err := config.Load("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Routes) != 3 {
		t.Fatalf("%d routes", len(c.Routes))
	}
	pay, capture, refund := c.Routes[0].Settings, c.Routes[1].Settings, c.Routes[2].Settings
	if pay.Concurrent != config.ConcurrentReject || pay.Lease != 10*time.Second || pay.MaxRequestBody != 1<<20 {
		t.Errorf("create-payment did not inherit defaults: %+v", pay)
	}
	if capture.Concurrent != config.ConcurrentWait || capture.MaxWait != 10*time.Second ||
		!slices.Equal(capture.Fingerprint.IgnoreJSONFields, []string{"/client_sent_at"}) ||
		!slices.Equal(capture.Fingerprint.Headers, []string{"Content-Type"}) {
		t.Errorf("capture-order overrides: %+v", capture)
	}
	if refund.RequireKey || !slices.Equal(refund.ReleaseOn, []int{429, 502, 503, 504}) {
		t.Errorf("create-refund overrides: %+v", refund)
	}
	if !slices.Equal(pay.ReleaseOn, []int{429, 503}) {
		t.Errorf("a route's override leaked into another route: %v", pay.ReleaseOn)
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	t.Setenv("IDEMPROXY_STORE_REDIS_PASSWORD", "s3cret")
	t.Setenv("IDEMPROXY_STORE_REDIS_ADDRS", "10.0.0.1:6379, 10.0.0.2:6379")
	t.Setenv("IDEMPROXY_LISTEN", ":18080")
	t.Setenv("IDEMPROXY_DEFAULTS_LEASE", "15s")
	t.Setenv("IDEMPROXY_DEFAULTS_RELEASE_ON", "429,502,503")
	t.Setenv("IDEMPROXY_IDENTITY_TRUSTED_PROXIES", "10.1.0.0/16")
	c, err := config.Load("testdata/valid_minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Store.Redis.Password != "s3cret" || c.Listen != ":18080" ||
		!slices.Equal(c.Store.Redis.Addrs, []string{"10.0.0.1:6379", "10.0.0.2:6379"}) {
		t.Errorf("top-level overrides not applied: %+v", c)
	}
	if c.Routes[0].Settings.Lease != 15*time.Second || !slices.Equal(c.Routes[0].Settings.ReleaseOn, []int{429, 502, 503}) {
		t.Errorf("defaults overrides not inherited by the route: %+v", c.Routes[0].Settings)
	}
	if !slices.Equal(c.Identity.TrustedProxies, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}) {
		t.Errorf("trusted proxies = %v", c.Identity.TrustedProxies)
	}
	t.Setenv("IDEMPROXY_DEFAULTS_LEASE", "soon")
	if _, err := config.Load("testdata/valid_minimal.yaml"); err == nil || !strings.Contains(err.Error(), `defaults.lease (from IDEMPROXY_DEFAULTS_LEASE): must be a duration`) {
		t.Errorf("bad env value: %v, want it named by its key and its variable (issue 32)", err)
	}
	// A value that decodes but does not validate names its variable too,
	// and so does a list element.
	t.Setenv("IDEMPROXY_DEFAULTS_LEASE", "")
	os.Unsetenv("IDEMPROXY_DEFAULTS_LEASE")
	t.Setenv("IDEMPROXY_LISTEN", "8080")
	t.Setenv("IDEMPROXY_STORE_REDIS_ADDRS", "redis:6379,redis")
	_, err = config.Load("testdata/valid_minimal.yaml")
	for _, want := range []string{
		`listen (from IDEMPROXY_LISTEN): must be host:port (e.g. :8080, 127.0.0.1:8080, redis:6379), got "8080"`,
		`store.redis.addrs[1] (from IDEMPROXY_STORE_REDIS_ADDRS): must be host:port`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad env value: %v, want %q", err, want)
		}
	}
}

func TestMissingFile(t *testing.T) {
	if _, err := config.Load("testdata/does-not-exist.yaml"); err == nil || !strings.Contains(err.Error(), "does-not-exist.yaml") {
		t.Errorf("missing file: %v, want an error naming it", err)
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"512": 512, "1KiB": 1024, "1MiB": 1 << 20, "2 GiB": 2 << 30, "10B": 10} {
		t.Run(in, func(t *testing.T) {
			got, err := config.ParseSize(in)
			if err != nil || got != want {
				t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
			}
		})
	}
	for _, in := range []string{"", "banana", "1MB", "-1", "1.5MiB", "99999999999GiB"} {
		if _, err := config.ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestWarnings(t *testing.T) {
	// production is the defaults with a Redis: no warning.
	production := func() *config.Config {
		c := config.Default()
		c.Store.Redis.Addrs = []string{"redis:6379"}
		c.Defaults.Quota.NewKeys = 1000
		c.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: c.Defaults}}
		return c
	}
	c := production()
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("defaults with a Redis warn: %q", w)
	}
	if w := config.Default().Warnings(); len(w) != 2 || !strings.HasPrefix(w[0], "routes: none: every request is forwarded unprotected") || !strings.HasPrefix(w[1], "store.redis.addrs: empty: the embedded in-memory store") {
		t.Errorf("nothing configured: warnings = %q, want one naming routes (issue 32: a config without routes protects nothing) and one naming store.redis.addrs", w)
	}
	c.Identity.TrustedProxies = append(c.Identity.TrustedProxies, netip.MustParsePrefix("0.0.0.0/0"))
	w := c.Warnings()
	if len(w) != 1 || !strings.HasPrefix(w[0], "identity.trusted_proxies[2]: 0.0.0.0/0 trusts every peer") {
		t.Errorf("warnings = %q, want one naming identity.trusted_proxies[2]", w)
	}
	for _, cover := range [][]string{{"0.0.0.0/1", "128.0.0.0/1"}, {"0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/1"}, {"::/1", "8000::/1"}} {
		c = production()
		for _, p := range cover {
			c.Identity.TrustedProxies = append(c.Identity.TrustedProxies, netip.MustParsePrefix(p))
		}
		if w := c.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0], "identity.trusted_proxies: together the prefixes cover every") {
			t.Errorf("%v: warnings = %q, want one saying they cover every address", cover, w)
		}
	}
	c = production()
	c.Identity.TrustedProxies = append(c.Identity.TrustedProxies, netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("192.0.0.0/2"))
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("half the IPv4 space plus a quarter: %q, want no warning", w)
	}
	for _, mode := range []os.FileMode{0o644, 0o400} {
		c = production()
		c.Store.Redis.PasswordFile = filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(c.Store.Redis.PasswordFile, []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		w := c.Warnings()
		if mode == 0o644 && (len(w) != 1 || !strings.Contains(w[0], "is readable by every user")) {
			t.Errorf("password_file %v: warnings = %q, want one", mode, w)
		}
		if mode == 0o400 && len(w) != 0 {
			t.Errorf("password_file %v: warnings = %q, want none", mode, w)
		}
	}
	c = production()
	c.Drain.Timeout = 10 * time.Second
	w = c.Warnings()
	if len(w) != 1 || !strings.HasPrefix(w[0], "drain.timeout: 10s is shorter than upstream.timeout + upstream.late_answer_window (5m30s)") {
		t.Errorf("warnings = %q, want one naming drain.timeout", w)
	}
	c.Drain.Timeout = time.Minute
	if w := c.Warnings(); len(w) != 1 {
		t.Errorf("a drain.timeout shorter than the late-answer window does not warn: %q", w)
	}
	c.Upstream.LateAnswerWindow = 0
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("a drain.timeout longer than upstream.timeout, no late answers, warns: %q", w)
	}
	c = production()
	c.Upstream.MaxLateCalls = 0
	if w := c.Warnings(); len(w) != 1 || !strings.HasPrefix(w[0], "upstream.max_late_calls: 0") {
		t.Errorf("warnings = %q, want one naming upstream.max_late_calls", w)
	}
}

// With key files, sealing is required unless the file says false, which
// -check warns about (issue 24): a planted plaintext record must not be
// replayed by default.
func TestSealingRequiredByDefaultWithKeyFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		yaml     string
		required bool
		warned   bool
	}{
		{"store:\n  encryption:\n    key_files: [/k]\n", true, false},
		{"store:\n  encryption:\n    key_files: [/k]\n    required: false\n", false, true},
		{"store:\n  encryption:\n    key_files: []\n", false, false},
	} {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(tc.yaml+"routes:\n  - name: pay\n    match: \"POST /payments\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := config.Load(p)
		if err != nil {
			t.Fatalf("%s: %v", tc.yaml, err)
		}
		warned := slices.ContainsFunc(c.Warnings(), func(w string) bool { return strings.HasPrefix(w, "store.encryption.required") })
		if c.Store.Encryption.Required != tc.required || warned != tc.warned {
			t.Errorf("%s: required %t warned %t, want %t %t", tc.yaml, c.Store.Encryption.Required, warned, tc.required, tc.warned)
		}
	}
}

// TestConfigFileSizeLimit (issue 31): a config path to something without
// end, or far larger than any config, fails with a message instead of
// filling memory.
func TestConfigFileSizeLimit(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", config.MaxFileSize)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{big, "/dev/zero"} {
		if _, err := config.Load(path); err == nil || !strings.Contains(err.Error(), "larger than the 4 MiB") {
			t.Errorf("%s: %v, want refused as too large", path, err)
		}
	}
}

// TestStrayEnvironmentIsWarned (issue 57): an IDEMPROXY_* variable that
// names no key (a typo: IDEMPROXY_LISTN) is warned about, as an unknown
// key in the file is refused; the tooling's own (IDEMPROXY_REQUIRE_REDIS)
// and real overrides are not. Before, the typo passed silently and the
// default stayed in force.
func TestStrayEnvironmentIsWarned(t *testing.T) {
	t.Setenv("IDEMPROXY_LISTN", ":9999")
	t.Setenv("IDEMPROXY_REQUIRE_REDIS", "1")
	t.Setenv("IDEMPROXY_DEFAULTS_LEASE", "20s")
	c, err := config.Load("testdata/valid_minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var stray []string
	for _, w := range c.Warnings() {
		if strings.HasPrefix(w, "IDEMPROXY_") {
			stray = append(stray, w)
		}
	}
	if len(stray) != 1 || !strings.HasPrefix(stray[0], "IDEMPROXY_LISTN: set, but it names no config key") {
		t.Errorf("warnings about the environment = %q, want one naming IDEMPROXY_LISTN", stray)
	}
}

// TestOneWarningForAnUnsetQuota (issue 57): the README's minimal config
// warned once per route about defaults.quota.new_keys; it is one warning
// naming the routes it leaves unbounded.
func TestOneWarningForAnUnsetQuota(t *testing.T) {
	c := config.Default()
	c.Store.Redis.Addrs = []string{"redis:6379"}
	c.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: c.Defaults}, {Name: "orders", Match: "POST /orders", Settings: c.Defaults}}
	var quota []string
	for _, w := range c.Warnings() {
		if strings.Contains(w, "quota.new_keys") {
			quota = append(quota, w)
		}
	}
	if len(quota) != 1 || !strings.HasPrefix(quota[0], "defaults.quota.new_keys: 0 (routes without one of their own: pay, orders)") {
		t.Errorf("quota warnings = %q, want one naming both routes", quota)
	}
}

// TestPostgresStreamsWaitForFormat5: on PostgreSQL a streamed route
// under record_format 4, stream: auto written or inherited, is warned
// about (each append rewrites the whole value), not under 5, nor on Redis; and there an unset
// stream_flush_interval is 20ms, a set one is kept.
func TestPostgresStreamsWaitForFormat5(t *testing.T) {
	load := func(store string, format int, flush string) *config.Config {
		t.Helper()
		path := filepath.Join(t.TempDir(), "c.yaml")
		text := fmt.Sprintf("store:\n%s  record_format: %d\n%sroutes:\n  - name: chat\n    match: \"POST /chat\"\n    stream: auto\n", store, format, flush)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const pg = "  postgres:\n    url: postgres://idemproxy@127.0.0.1:5432/app\n"
	const redis = "  redis:\n    addrs: [\"127.0.0.1:6379\"]\n"
	square := func(c *config.Config) bool {
		for _, w := range c.Warnings() {
			if strings.Contains(w, "square of its length") {
				return true
			}
		}
		return false
	}
	if c := load(pg, 4, ""); !square(c) {
		t.Errorf("PostgreSQL, format 4, a streamed route: warnings %q, want the square's", c.Warnings())
	}
	if c := load(pg, 5, ""); square(c) || c.Routes[0].Settings.StreamFlushInterval != 20*time.Millisecond {
		t.Errorf("PostgreSQL, format 5: warned %v, flush interval %s; want no warning and 20ms", square(c), c.Routes[0].Settings.StreamFlushInterval)
	}
	if c := load(pg, 5, "defaults:\n  stream_flush_interval: 0s\n"); c.Routes[0].Settings.StreamFlushInterval != 0 {
		t.Errorf("PostgreSQL with stream_flush_interval: 0s: %s, want it kept", c.Routes[0].Settings.StreamFlushInterval)
	}
	implicit := filepath.Join(t.TempDir(), "implicit.yaml")
	if err := os.WriteFile(implicit, []byte("store:\n"+pg+"  record_format: 4\nroutes:\n  - name: chat\n    match: \"POST /chat\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := config.Load(implicit); err != nil || !square(c) {
		t.Errorf("PostgreSQL, format 4, a route streaming by default (stream not written): %v, %v; want the square's warning", err, c.Warnings())
	}
	if c := load(redis, 4, ""); square(c) || c.Routes[0].Settings.StreamFlushInterval != 0 {
		t.Errorf("Redis, format 4: warned %v, flush interval %s; want neither", square(c), c.Routes[0].Settings.StreamFlushInterval)
	}
}

// TestGRPCRouteWaitsByDefault (issue 80): a protocol: grpc route's
// concurrent is wait unless it says otherwise (hedged copies get the first
// copy's answer), with UNAVAILABLE and RESOURCE_EXHAUSTED freeing keys;
// an HTTP route keeps defaults:'.
func TestGRPCRouteWaitsByDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := `upstream:
  url: "http://127.0.0.1:3000"
routes:
  - name: hedged
    match: "POST /a.v1.S/A"
    protocol: grpc
  - name: rejecting
    match: "POST /a.v1.S/B"
    protocol: grpc
    concurrent: reject
  - name: plain
    match: "POST /c"
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{config.ConcurrentWait, config.ConcurrentReject, config.DefaultConcurrent} {
		if got := c.Routes[i].Settings.Concurrent; got != want {
			t.Errorf("routes[%d] (%s): concurrent %q, want %q", i, c.Routes[i].Name, got, want)
		}
	}
	if got := c.Routes[0].GRPC.ReleaseCodes; !slices.Equal(got, []string{"UNAVAILABLE", "RESOURCE_EXHAUSTED"}) {
		t.Errorf("grpc.release_codes default %v", got)
	}
}
