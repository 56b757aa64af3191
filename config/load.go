package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
)

// EnvPrefix is the prefix of every environment override.
const EnvPrefix = "IDEMPROXY"

// topKeys are the keys outside defaults: and routes:, by YAML path.
var topKeys = []string{
	"listen", "admin_listen", "admin_pprof", "log_level",
	"upstream.url", "upstream.timeout", "upstream.late_answer_window", "upstream.max_late_calls", "drain.delay", "drain.timeout",
	"store.redis.addrs", "store.redis.master_name", "store.redis.username",
	"store.redis.password", "store.redis.password_file",
	"store.redis.sentinel_username", "store.redis.sentinel_password", "store.redis.sentinel_password_file", "store.redis.tls", "store.redis.tls_ca_file", "store.redis.tls_server_name", "store.key_prefix",
	"store.wait_replicas", "store.wait_timeout",
	"identity.header", "identity.trusted_proxies",
}

// settingKeys are the keys of Settings, relative to defaults: or a route.
var settingKeys = []string{
	"key_header", "require_key", "scope", "retention", "lease", "concurrent",
	"max_wait", "release_on", "unknown_outcome", "store_unavailable",
	"max_request_body", "max_response_body",
	"fingerprint.headers", "fingerprint.ignore_json_fields",
}

// Load reads the YAML file at path, applies IDEMPROXY_* environment
// overrides and validates the result. The returned error lists every problem
// found, each prefixed with its YAML path.
func Load(path string) (*Config, error) {
	v := viper.New()
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	for _, k := range topKeys {
		_ = v.BindEnv(k) // only fails without a key name
	}
	for _, k := range settingKeys {
		_ = v.BindEnv("defaults." + k)
	}
	if err := v.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}

	d := &decoder{}
	c := Default()
	d.unknown(v.AllKeys())
	src := viperSource{v}
	d.str(src, "listen", "listen", &c.Listen)
	d.str(src, "admin_listen", "admin_listen", &c.AdminListen)
	d.boolean(src, "admin_pprof", "admin_pprof", &c.AdminPprof)
	d.str(src, "log_level", "log_level", &c.LogLevel)
	d.str(src, "upstream.url", "upstream.url", &c.Upstream.URL)
	d.duration(src, "upstream.timeout", "upstream.timeout", &c.Upstream.Timeout)
	d.duration(src, "upstream.late_answer_window", "upstream.late_answer_window", &c.Upstream.LateAnswerWindow)
	d.integer(src, "upstream.max_late_calls", "upstream.max_late_calls", &c.Upstream.MaxLateCalls)
	d.duration(src, "drain.delay", "drain.delay", &c.Drain.Delay)
	d.duration(src, "drain.timeout", "drain.timeout", &c.Drain.Timeout)
	d.strings(src, "store.redis.addrs", "store.redis.addrs", &c.Store.Redis.Addrs)
	d.str(src, "store.redis.master_name", "store.redis.master_name", &c.Store.Redis.MasterName)
	d.str(src, "store.redis.username", "store.redis.username", &c.Store.Redis.Username)
	d.str(src, "store.redis.password", "store.redis.password", &c.Store.Redis.Password)
	d.str(src, "store.redis.password_file", "store.redis.password_file", &c.Store.Redis.PasswordFile)
	d.str(src, "store.redis.sentinel_username", "store.redis.sentinel_username", &c.Store.Redis.SentinelUsername)
	d.str(src, "store.redis.sentinel_password", "store.redis.sentinel_password", &c.Store.Redis.SentinelPassword)
	d.str(src, "store.redis.sentinel_password_file", "store.redis.sentinel_password_file", &c.Store.Redis.SentinelPasswordFile)
	d.boolean(src, "store.redis.tls", "store.redis.tls", &c.Store.Redis.TLS)
	d.str(src, "store.redis.tls_ca_file", "store.redis.tls_ca_file", &c.Store.Redis.TLSCAFile)
	d.str(src, "store.redis.tls_server_name", "store.redis.tls_server_name", &c.Store.Redis.TLSServerName)
	d.integer(src, "store.wait_replicas", "store.wait_replicas", &c.Store.WaitReplicas)
	d.duration(src, "store.wait_timeout", "store.wait_timeout", &c.Store.WaitTimeout)
	d.str(src, "store.key_prefix", "store.key_prefix", &c.Store.KeyPrefix)
	d.str(src, "identity.header", "identity.header", &c.Identity.Header)
	var proxies []string
	if d.strings(src, "identity.trusted_proxies", "identity.trusted_proxies", &proxies) {
		c.Identity.TrustedProxies = nil
		for i, p := range proxies {
			pfx, err := parsePrefix(p)
			if err != nil {
				d.errorf(fmt.Sprintf("identity.trusted_proxies[%d]", i), "%v", err)
				continue
			}
			c.Identity.TrustedProxies = append(c.Identity.TrustedProxies, pfx)
		}
	}
	d.settings(prefixed{src, "defaults."}, "defaults.", &c.Defaults)

	if raw := v.Get("routes"); raw != nil {
		list, ok := raw.([]any)
		if !ok {
			d.errorf("routes", "must be a list of routes, got %s", describe(raw))
		}
		for i, item := range list {
			path := fmt.Sprintf("routes[%d]", i)
			m, ok := item.(map[string]any)
			if !ok {
				d.errorf(path, "must be a mapping with name and match, got %s", describe(item))
				continue
			}
			c.Routes = append(c.Routes, d.route(m, path, c.Defaults))
		}
	}
	return c, errors.Join(d.err(), c.validate(d.failed))
}

// parsePrefix accepts a CIDR or a bare address (a /32 or /128).
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR prefix", s)
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// source looks up a value by dotted key.
type source interface {
	lookup(key string) (any, bool)
}

type viperSource struct{ v *viper.Viper }

func (s viperSource) lookup(key string) (any, bool) {
	if !s.v.IsSet(key) {
		return nil, false
	}
	return s.v.Get(key), true
}

type prefixed struct {
	s      source
	prefix string
}

func (p prefixed) lookup(key string) (any, bool) { return p.s.lookup(p.prefix + key) }

// mapSource looks up dotted keys in a nested YAML mapping.
type mapSource map[string]any

func (m mapSource) lookup(key string) (any, bool) {
	var cur any = map[string]any(m)
	for part := range strings.SplitSeq(key, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// decoder converts loosely typed YAML and environment values, collecting
// every problem with its path instead of stopping at the first.
type decoder struct {
	errs []error
	// failed holds the paths that already have a problem, so validation does
	// not report a second, confusing one for the same key.
	failed map[string]bool
}

func (d *decoder) errorf(path, format string, args ...any) {
	if d.failed == nil {
		d.failed = map[string]bool{}
	}
	d.failed[path] = true
	d.errs = append(d.errs, fmt.Errorf("%s: "+format, append([]any{path}, args...)...))
}

func (d *decoder) err() error { return errors.Join(d.errs...) }

// unknown reports keys outside the known set, which are most often typos
// that would otherwise silently leave a default in force.
func (d *decoder) unknown(keys []string) {
	known := map[string]bool{"routes": true}
	for _, k := range topKeys {
		known[k] = true
	}
	for _, k := range settingKeys {
		known["defaults."+k] = true
	}
	sort.Strings(keys)
	for _, k := range keys {
		// Routes are checked one by one, with their index in the path.
		if !known[k] && !strings.HasPrefix(k, "routes.") {
			d.errorf(k, "unknown key")
		}
	}
}

func (d *decoder) route(m map[string]any, path string, defaults Settings) Route {
	r := Route{Settings: clone(defaults), set: map[string]bool{}}
	known := map[string]bool{"name": true, "match": true}
	for _, k := range settingKeys {
		known[k] = true
	}
	for _, k := range leafKeys(m, "") {
		if !known[k] {
			d.errorf(path+"."+k, "unknown key")
		}
		r.set[k] = true
	}
	src := mapSource(m)
	d.str(src, "name", path+".name", &r.Name)
	d.str(src, "match", path+".match", &r.Match)
	d.settings(src, path+".", &r.Settings)
	return r
}

// leafKeys flattens a nested mapping into dotted keys.
func leafKeys(m map[string]any, prefix string) []string {
	var keys []string
	for k, v := range m {
		if mm, ok := v.(map[string]any); ok && len(mm) > 0 {
			keys = append(keys, leafKeys(mm, prefix+k+".")...)
			continue
		}
		keys = append(keys, prefix+k)
	}
	sort.Strings(keys)
	return keys
}

func clone(s Settings) Settings {
	s.ReleaseOn = slices.Clone(s.ReleaseOn)
	s.Fingerprint.Headers = slices.Clone(s.Fingerprint.Headers)
	s.Fingerprint.IgnoreJSONFields = slices.Clone(s.Fingerprint.IgnoreJSONFields)
	return s
}

func (d *decoder) settings(src source, path string, s *Settings) {
	d.str(src, "key_header", path+"key_header", &s.KeyHeader)
	d.boolean(src, "require_key", path+"require_key", &s.RequireKey)
	d.str(src, "scope", path+"scope", &s.Scope)
	d.duration(src, "retention", path+"retention", &s.Retention)
	d.duration(src, "lease", path+"lease", &s.Lease)
	d.str(src, "concurrent", path+"concurrent", &s.Concurrent)
	d.duration(src, "max_wait", path+"max_wait", &s.MaxWait)
	d.ints(src, "release_on", path+"release_on", &s.ReleaseOn)
	d.str(src, "unknown_outcome", path+"unknown_outcome", &s.UnknownOutcome)
	d.str(src, "store_unavailable", path+"store_unavailable", &s.StoreUnavailable)
	d.size(src, "max_request_body", path+"max_request_body", &s.MaxRequestBody)
	d.size(src, "max_response_body", path+"max_response_body", &s.MaxResponseBody)
	d.strings(src, "fingerprint.headers", path+"fingerprint.headers", &s.Fingerprint.Headers)
	d.strings(src, "fingerprint.ignore_json_fields", path+"fingerprint.ignore_json_fields", &s.Fingerprint.IgnoreJSONFields)
}

func (d *decoder) str(src source, key, path string, dst *string) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	switch t := v.(type) {
	case string:
		*dst = t
	case int, int64, float64, bool:
		*dst = fmt.Sprint(t)
	default:
		d.errorf(path, "must be a string, got %s", describe(v))
	}
}

func (d *decoder) boolean(src source, key, path string, dst *bool) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	switch t := v.(type) {
	case bool:
		*dst = t
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(t))
		if err != nil {
			d.errorf(path, "must be true or false, got %q", t)
			return
		}
		*dst = b
	default:
		d.errorf(path, "must be true or false, got %s", describe(v))
	}
}

func (d *decoder) integer(src source, key, path string, dst *int) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	switch t := v.(type) {
	case int:
		*dst = t
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(t))
		if err != nil {
			d.errorf(path, "must be a whole number, got %q", t)
			return
		}
		*dst = n
	default:
		d.errorf(path, "must be a whole number, got %s", describe(v))
	}
}

func (d *decoder) duration(src source, key, path string, dst *time.Duration) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	s, ok := v.(string)
	if !ok {
		d.errorf(path, "must be a duration with a unit, like 10s or 24h, got %s", describe(v))
		return
	}
	dur, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		d.errorf(path, "must be a duration with a unit, like 10s or 24h, got %q", s)
		return
	}
	*dst = dur
}

func (d *decoder) size(src source, key, path string, dst *int64) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	n, err := parseSize(v)
	if err != nil {
		d.errorf(path, "%v", err)
		return
	}
	*dst = n
}

// list reads a YAML list or, from the environment, a comma-separated
// string, into its items.
func list(v any) ([]any, bool) {
	switch t := v.(type) {
	case []any:
		return t, true
	case []string:
		out := make([]any, len(t))
		for i, s := range t {
			out[i] = s
		}
		return out, true
	case string:
		var out []any
		for part := range strings.SplitSeq(t, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
		return out, true
	}
	return nil, false
}

// strings decodes a list of strings. It reports whether the key was
// present and a list.
func (d *decoder) strings(src source, key, path string, dst *[]string) bool {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return false
	}
	items, ok := list(v)
	if !ok {
		d.errorf(path, "must be a list of strings, got %s", describe(v))
		return false
	}
	var out []string
	for i, item := range items {
		s, ok := item.(string)
		if !ok {
			d.errorf(fmt.Sprintf("%s[%d]", path, i), "must be a string, got %s", describe(item))
			continue
		}
		out = append(out, s)
	}
	*dst = out
	return true
}

func (d *decoder) ints(src source, key, path string, dst *[]int) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	items, ok := list(v)
	if !ok {
		d.errorf(path, "must be a list of HTTP status codes, got %s", describe(v))
		return
	}
	out := []int{}
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		switch t := item.(type) {
		case int:
			out = append(out, t)
		case string:
			n, err := strconv.Atoi(t)
			if err != nil {
				d.errorf(ipath, "must be an HTTP status code, got %q", t)
				continue
			}
			out = append(out, n)
		default:
			d.errorf(ipath, "must be an HTTP status code, got %s", describe(item))
		}
	}
	*dst = out
}

// ParseSize reads a byte size written as in the config file: a plain
// number of bytes, or a number with a KiB, MiB or GiB suffix.
func ParseSize(s string) (int64, error) { return parseSize(s) }

// parseSize reads a byte size: a plain number of bytes, or a number with a
// KiB, MiB or GiB suffix. viper's own GetSizeInBytes silently returns 0 for
// values it does not understand, which would disable a limit.
func parseSize(v any) (int64, error) {
	switch t := v.(type) {
	case int:
		if t < 0 {
			return 0, fmt.Errorf("must not be negative, got %d", t)
		}
		return int64(t), nil
	case string:
		s := strings.TrimSpace(t)
		mult := int64(1)
		for _, u := range []struct {
			suffix string
			mult   int64
		}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
			if strings.HasSuffix(s, u.suffix) {
				s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
				break
			}
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n > (1<<62)/mult {
			return 0, fmt.Errorf("must be a size like 512KiB, 1MiB, 1GiB or a number of bytes, got %q", t)
		}
		return n * mult, nil
	default:
		return 0, fmt.Errorf("must be a size like 512KiB, 1MiB, 1GiB or a number of bytes, got %s", describe(v))
	}
}

// describe names a YAML value's type for an error message.
func describe(v any) string {
	switch t := v.(type) {
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return strconv.Quote(t)
	default:
		return fmt.Sprintf("%v", t)
	}
}
