package main

import (
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/proxy"
)

// The adapter turns YAML strings into the proxy's typed settings; a route
// written "post /payments" must protect POST /payments.
func TestProxyRoutes(t *testing.T) {
	s := config.DefaultSettings()
	s.Scope, s.Concurrent, s.UnknownOutcome, s.StoreUnavailable = config.ScopePrincipal, config.ConcurrentWait, config.OutcomeKeep, config.FailOpen
	got := proxyRoutes([]config.Route{
		{Name: "a", Match: "post  /payments", Settings: s},
		{Name: "b", Match: "POST /refunds", Settings: config.DefaultSettings()},
	}, nil)
	a, b := got[0], got[1]
	if a.Pattern != "POST /payments" || !a.SharedScope || !a.Wait || a.Unknown != proxy.Keep || !a.FailOpen {
		t.Errorf("route a = %+v", a)
	}
	if b.Pattern != "POST /refunds" || b.SharedScope || b.Wait || b.Unknown != proxy.Fail || b.FailOpen || !b.RequireKey {
		t.Errorf("route b = %+v", b)
	}
	s.UnknownOutcome = config.OutcomeRelease
	if r := proxyRoutes([]config.Route{{Name: "c", Match: "POST /c", Settings: s}}, nil); r[0].Unknown != proxy.Release {
		t.Errorf("release mapped to %v", r[0].Unknown)
	}
}

// TestEverySettingReachesTheProxy: each leaf field of config.Settings,
// changed alone, changes the proxy.Route it compiles to, so a key added to
// the config and forgotten in proxyRoutes fails here.
func TestEverySettingReachesTheProxy(t *testing.T) {
	base := config.Route{Name: "pay", Match: "POST /payments", Settings: config.DefaultSettings()}
	want := proxyRoutes([]config.Route{base}, nil)[0]
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f, sf := v.Field(i), v.Type().Field(i)
			p := path + sf.Name
			if f.Kind() == reflect.Struct && f.Type() != reflect.TypeFor[time.Duration]() {
				walk(f, p+".")
				continue
			}
			r := base
			r.Settings = config.DefaultSettings()
			wantHere := want
			switch p {
			case "ProblemContentType": // it goes with a problem_body
				r.Settings.ProblemBody = `{"error":{{json .Code}}}`
				wantHere = proxyRoutes([]config.Route{r}, nil)[0]
			case "MaxInFlightPrincipalShare": // a share of a max_in_flight
				r.Settings.MaxInFlight = 8
				wantHere = proxyRoutes([]config.Route{r}, nil)[0]
			case "FirstSent": // a list of known sources: add the other one
				r.Settings.FirstSent = []string{config.FirstSentHeader, config.FirstSentUUIDv7}
				if got := proxyRoutes([]config.Route{r}, nil)[0]; reflect.DeepEqual(got, wantHere) {
					t.Errorf("config.Settings.%s does not reach proxy.Route", p)
				}
				continue
			}
			changeLeaf(t, reflect.ValueOf(&r.Settings).Elem().FieldByIndex(fieldIndex(v, path, sf)), p)
			if got := proxyRoutes([]config.Route{r}, nil)[0]; reflect.DeepEqual(got, wantHere) {
				t.Errorf("config.Settings.%s does not reach proxy.Route", p)
			}
		}
	}
	walk(reflect.ValueOf(config.DefaultSettings()), "")
}

// fieldIndex is the index path of sf, a field of v found at path (dotted
// names from Settings), within Settings.
func fieldIndex(v reflect.Value, path string, sf reflect.StructField) []int {
	var idx []int
	t := reflect.TypeFor[config.Settings]()
	for name := range strings.SplitSeq(strings.TrimSuffix(path, "."), ".") {
		if name == "" {
			continue
		}
		f, _ := t.FieldByName(name)
		idx = append(idx, f.Index...)
		t = f.Type
	}
	return append(idx, sf.Index...)
}

// changeLeaf sets f to a valid value other than its default.
func changeLeaf(t *testing.T, f reflect.Value, path string) {
	t.Helper()
	switch v := f.Addr().Interface().(type) {
	case *string:
		*v = map[string]string{
			"KeyHeader": "X-Other-Key", "Scope": config.ScopePrincipal, "Concurrent": config.ConcurrentWait,
			"UnknownOutcome": config.OutcomeRelease, "StoreUnavailable": config.FailOpen,
			"Replay.AuthorizeURL": "http://127.0.0.1:1/allow",
			"KeyJSONPointer":      "/request_id",
			"ProblemBody":         `{"error":{"code":{{json .Code}}}}`,
			"ProblemContentType":  "application/vnd.api+json",
		}[path]
		if *v == "" {
			t.Fatalf("changeLeaf: no value for string setting %s; add one", path)
		}
	case *bool:
		*v = !*v
	case *int:
		*v++
	case *int64:
		*v++
	case *float64:
		*v /= 2
	case *time.Duration:
		*v += time.Second
	case *[]int:
		*v = append(*v, 500)
	case *[]string:
		*v = append(*v, "/x")
	default:
		t.Fatalf("changeLeaf: no change for %s (%T); add one", path, v)
	}
}

// consumers names, for every top-level configuration key that proxyConfig
// does not carry to the proxy, the file that reads it and what it reads
// there (checked to be in that file), so that a key added to the config
// and wired nowhere fails TestEveryKeyIsConsumed.
var consumers = map[string]struct{ file, reads string }{
	"listen":                             {"server.go", "s.cfg.Listen"},
	"admin_listen":                       {"server.go", "s.cfg.AdminListen"},
	"admin_pprof_listen":                 {"server.go", "s.cfg.AdminPprofListen"},
	"log_level":                          {"server.go", "cfg.SlogLevel()"},
	"client.read_header_timeout":         {"server.go", "s.cfg.Client.ReadHeaderTimeout"},
	"limits.principal_share":             {"adapt.go", "cfg.Limits.PrincipalShare"}, // a share of the buffer budget: zero without one
	"tracing.enabled":                    {"tracing.go", "cfg.Enabled"},
	"tracing.trust_incoming":             {"adapt.go", "t.TrustIncoming"}, // proxy.Options.TraceTrust
	"admin.token_file":                   {"secrets.go", "cfg.Admin.TokenFile"},
	"admin.readiness_requires_store":     {"server.go", "s.cfg.Admin.ReadinessRequiresStore"},
	"store.redis.addrs":                  {"adapt.go", "slices.Clone(r.Addrs)"},
	"store.postgres.url":                 {"storecmd.go", "pg.URL"},
	"store.postgres.password":            {"secrets.go", "cfg.Store.Postgres.Password"},
	"store.postgres.password_file":       {"secrets.go", "cfg.Store.Postgres.PasswordFile"},
	"store.postgres.schema":              {"server.go", "pg.Schema"},
	"store.postgres.create_schema":       {"server.go", "pg.CreateSchema"},
	"store.postgres.max_conns":           {"server.go", "pg.MaxConns"},
	"store.postgres.listen_url":          {"server.go", "pg.ListenURL"},
	"store.redis.master_name":            {"adapt.go", "r.MasterName"},
	"store.redis.username":               {"adapt.go", "r.Username"},
	"store.redis.password":               {"adapt.go", "r.Password"},
	"store.redis.password_file":          {"secrets.go", "r.PasswordFile"},
	"store.redis.sentinel_username":      {"adapt.go", "r.SentinelUsername"},
	"store.redis.sentinel_password":      {"adapt.go", "r.SentinelPassword"},
	"store.redis.sentinel_password_file": {"secrets.go", "r.SentinelPasswordFile"},
	"store.redis.tls":                    {"adapt.go", "r.TLS"},
	"store.redis.tls_ca_file":            {"adapt.go", "r.TLSCAFile"},
	"store.redis.tls_server_name":        {"adapt.go", "r.TLSServerName"},
	"store.record_format":                {"adapt.go", "st.RecordFormat"},
	"store.key_prefix":                   {"server.go", "s.cfg.Store.KeyPrefix"},
	"store.pipeline":                     {"adapt.go", "st.Pipeline"},
	"store.compression":                  {"adapt.go", "st.Compression"},
	"store.wait_replicas":                {"adapt.go", "st.WaitReplicas"},
	"store.wait_timeout":                 {"adapt.go", "st.WaitTimeout"},
	"store.claim_memory_limit":           {"server.go", "cfg.Store.ClaimMemoryLimit"},
	"store.encryption.key_files":         {"secrets.go", "st.Encryption.KeyFiles"},
	"store.encryption.required":          {"secrets.go", "st.Encryption.Required"},
	"store.key_secret_file":              {"secrets.go", "st.KeySecretFile"},
	"drain.delay":                        {"server.go", "s.cfg.Drain.Delay"},
	"drain.timeout":                      {"server.go", "s.cfg.Grace()"},
	"upstream.health_path":               {"server.go", "cfg.Upstream.HealthPath"},
}

// TestEveryKeyIsConsumed (issue 31): every leaf of config.Config outside
// routes, changed alone, either changes the proxy.Config it compiles to or
// is named in consumers with the file that reads it. Before v0.5.0
// pass_through_upgrades and the top-level defaults.problem_body were
// parsed, validated and documented and reached nothing.
func TestEveryKeyIsConsumed(t *testing.T) {
	base := config.Default()
	base.Routes = []config.Route{{Name: "pay", Match: "POST /payments", Settings: base.Defaults}}
	want, err := proxyConfig(base, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var walk func(typ reflect.Type, index []int, path string)
	walk = func(typ reflect.Type, index []int, path string) {
		for i := range typ.NumField() {
			sf := typ.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
			if name == "-" || !sf.IsExported() {
				continue
			}
			p := strings.TrimPrefix(path+"."+name, ".")
			idx := append(slices.Clone(index), i)
			if sf.Type.Kind() == reflect.Struct && sf.Type != reflect.TypeFor[time.Duration]() {
				walk(sf.Type, idx, p)
				continue
			}
			if strings.HasPrefix(p, "defaults.") && p != "defaults.problem_body" && p != "defaults.problem_content_type" {
				continue // per-route settings: TestEverySettingReachesTheProxy
			}
			seen[p] = true
			cfg := config.Default()
			cfg.Routes = base.Routes
			if p == "defaults.problem_content_type" {
				cfg.Defaults.ProblemBody = `{"error":{{json .Code}}}`
			}
			wantHere := want
			if p == "defaults.problem_content_type" {
				wantHere, _ = proxyConfig(cfg, nil)
			}
			f := reflect.ValueOf(cfg).Elem().FieldByIndex(idx)
			changeConfigLeaf(t, f, p)
			got, err := proxyConfig(cfg, nil)
			if err != nil {
				t.Fatalf("%s changed: %v", p, err)
			}
			reaches := !reflect.DeepEqual(got, wantHere)
			c, named := consumers[p]
			switch {
			case reaches && named:
				t.Errorf("%s reaches the proxy and is also named in consumers (%s): drop it there", p, c.file)
			case !reaches && !named:
				t.Errorf("%s reaches neither the proxy nor any named consumer: wire it, or name the file that reads it in consumers", p)
			case named:
				b, err := os.ReadFile(c.file)
				if err != nil || !strings.Contains(string(b), c.reads) {
					t.Errorf("%s: %s does not read %q", p, c.file, c.reads)
				}
			}
		}
	}
	walk(reflect.TypeFor[config.Config](), nil, "")
	for p := range consumers {
		if !seen[p] {
			t.Errorf("consumers names %s, which is no key", p)
		}
	}
}

// changeConfigLeaf sets f to a valid value other than its default.
func changeConfigLeaf(t *testing.T, f reflect.Value, path string) {
	t.Helper()
	switch v := f.Addr().Interface().(type) {
	case *string:
		*v = map[string]string{
			"upstream.url": "http://127.0.0.1:3001", "identity.source": config.IdentityFromXFCC,
			"tracing.trust_incoming": config.TraceTrustAll, "problems.type_base_url": "https://errors.example/",
			"problems.docs_url": "https://docs.example/errors", "identity.header": "X-Other-User",
			"identity.jwt.jwks_url": "https://issuer.example/jwks", "identity.jwt.issuer": "https://issuer.example",
			"identity.jwt.claim": "email", "log_level": "debug",
			"defaults.problem_body":         `{"error":{"code":{{json .Code}}}}`,
			"defaults.problem_content_type": "application/vnd.api+json",
		}[path]
		if *v == "" {
			*v = "changed" // names, files, addresses: read as they are
		}
	case *bool:
		*v = !*v
	case *int:
		*v += 2
	case *int64:
		*v += 1 << 20
	case *float64:
		*v = *v/2 + 0.01
	case *time.Duration:
		*v += time.Second
	case *[]string:
		*v = append(*v, "x")
	case *[]int:
		*v = append(*v, 500)
	case *[]netip.Prefix:
		*v = append(*v, netip.MustParsePrefix("10.0.0.0/8"))
	default:
		t.Fatalf("changeConfigLeaf: no change for %s (%T); add one", path, v)
	}
}

// TestEveryConfigValueReachesTheProxy (issue 42): every value config/
// accepts for an enumerated setting has its proxy value, and a handler
// builds with it; a value the proxy does not know (one added to config/
// only, which -check would pass) makes proxy.New fail instead of answering
// every request wrongly (a provider: 401 to every delivery; a source:
// header identities).
func TestEveryConfigValueReachesTheProxy(t *testing.T) {
	build := func(mutate func(*config.Config)) error {
		cfg := config.Default()
		cfg.Routes = []config.Route{{Name: "r", Match: "POST /r", Settings: config.DefaultSettings()}}
		mutate(cfg)
		pcfg, err := proxyConfig(cfg, webhookSecrets{"r": {[]byte("a signing secret")}})
		if err != nil {
			return err
		}
		_, err = proxy.New(pcfg, nil, proxy.Options{})
		return err
	}
	for _, v := range config.IdentitySources {
		if err := build(func(c *config.Config) { c.Identity.Source = v; c.Identity.JWT.JWKSURL = "http://127.0.0.1:1/jwks" }); err != nil {
			t.Errorf("identity.source %s: %v", v, err)
		}
	}
	for _, v := range config.WebhookProviders {
		if err := build(func(c *config.Config) {
			c.Routes[0].Webhook = config.Webhook{Provider: v, SecretFiles: []string{"/run/secrets/hook"}}
		}); err != nil {
			t.Errorf("webhook.provider %s: %v", v, err)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(config.WebhookProviders)), proxy.Providers()) {
		t.Errorf("config accepts the providers %v, the proxy has %v", config.WebhookProviders, proxy.Providers())
	}
	for _, v := range config.UnknownOutcomes {
		if _, ok := unknownOutcomes[v]; !ok {
			t.Errorf("unknown_outcome %s has no proxy value", v)
		}
	}
	for _, v := range config.FirstSentSources {
		if _, ok := firstSentByName[v]; !ok {
			t.Errorf("first_sent %s has no proxy value", v)
		}
	}
	if err := build(func(c *config.Config) { c.Identity.Source = "ldap" }); err == nil {
		t.Error("identity.source ldap built a handler")
	}
	if err := build(func(c *config.Config) {
		c.Routes[0].Webhook = config.Webhook{Provider: "paypal", SecretFiles: []string{"/run/secrets/hook"}}
	}); err == nil {
		t.Error("webhook.provider paypal built a handler")
	}
}
