package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
)

// The decoder: loosely typed YAML and environment values into the typed
// Config, every problem collected with its YAML path.

// decode reads k from src (where it is found by k.path) into its field;
// path is how a problem names it.
func (d *decoder) decode(src source, k key, path string) {
	switch dst := k.field.Addr().Interface().(type) {
	case *string:
		d.str(src, k.path, path, dst)
	case *bool:
		d.boolean(src, k.path, path, dst)
	case *int:
		d.integer(src, k.path, path, dst)
	case *time.Duration:
		d.duration(src, k.path, path, dst)
	case *int64:
		d.size(src, k.path, path, dst)
	case *[]string:
		d.strings(src, k.path, path, dst)
	case *[]int:
		d.ints(src, k.path, path, dst)
	case *[]netip.Prefix:
		d.prefixes(src, k.path, path, dst)
	case *float64:
		d.percent(src, k.path, path, dst)
	default:
		panic(fmt.Sprintf("config: no decoder for %s (%T)", k.path, dst)) // a declaration error, caught by every test
	}
}

// prefixes decodes a list of CIDR prefixes or bare addresses.
func (d *decoder) prefixes(src source, key, path string, dst *[]netip.Prefix) {
	var list []string
	if !d.strings(src, key, path, &list) {
		return
	}
	out := []netip.Prefix{}
	for i, p := range list {
		pfx, err := parsePrefix(p)
		if err != nil {
			d.errorf(fmt.Sprintf("%s[%d]", path, i), "%v", err)
			continue
		}
		out = append(out, pfx)
	}
	*dst = out
}

// percent decodes a share written as a percentage ("90%") or a fraction
// (0.9).
func (d *decoder) percent(src source, key, path string, dst *float64) {
	v, ok := src.lookup(key)
	if !ok || v == nil {
		return
	}
	var f float64
	var err error
	switch t := v.(type) {
	case float64:
		f = t
	case int:
		f = float64(t)
	case string:
		s := strings.TrimSpace(t)
		if p, found := strings.CutSuffix(s, "%"); found {
			f, err = strconv.ParseFloat(strings.TrimSpace(p), 64)
			f /= 100
		} else {
			f, err = strconv.ParseFloat(s, 64)
		}
	default:
		err = fmt.Errorf("not a number")
	}
	if err != nil || f < 0 || f > 1 {
		d.errorf(path, "must be a percentage like 90%% (or a fraction like 0.9), got %s", describe(v))
		return
	}
	*dst = f
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
	d.errs = append(d.errs, fmt.Errorf("%s: "+format, append([]any{path + fromEnv(path)}, args...)...))
}

// fromEnv is " (from IDEMPROXY_X)" when the environment variable that
// overrides the key at path is set, so that a problem with its value names
// where the value came from; "" otherwise (and for routes, which come from
// the file only).
func fromEnv(path string) string {
	if strings.HasPrefix(path, "routes") {
		return ""
	}
	if i := strings.IndexByte(path, '['); i >= 0 {
		path = path[:i] // a list element: the list's variable
	}
	name := EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
	if _, set := os.LookupEnv(name); set {
		return " (from " + name + ")"
	}
	return ""
}

func (d *decoder) err() error { return errors.Join(d.errs...) }

// unknown reports keys outside the known set, which are most often typos
// that would otherwise silently leave a default in force.
func (d *decoder) unknown(keys []string) {
	known := map[string]bool{"routes": true}
	for _, k := range configKeyPaths {
		known[k] = true
	}
	sort.Strings(keys)
	for _, k := range keys {
		// Routes are checked one by one, with their index in the path.
		switch {
		case removedKeys[k] != "":
			d.errorf(k, "%s", removedKeys[k])
		case !known[k] && !strings.HasPrefix(k, "routes."):
			d.errorf(k, "unknown key")
		}
	}
}

// removedKeys are keys earlier versions accepted, with what replaced them.
var removedKeys = map[string]string{
	"admin_pprof": "removed: pprof is served only on its own loopback listener; set admin_pprof_listen: 127.0.0.1:6060",
}

func (d *decoder) route(m map[string]any, path string, defaults Settings) Route {
	r := Route{Settings: clone(defaults), set: map[string]bool{}, Webhook: Webhook{Tolerance: DefaultWebhookTolerance}}
	known := map[string]bool{}
	for _, k := range routeKeyPaths {
		known[k] = true
	}
	for _, k := range leafKeys(m, "") {
		if !known[k] {
			d.errorf(path+"."+k, "unknown key")
		}
		r.set[k] = true
	}
	src := mapSource(m)
	for _, k := range keysOf(&r, "") {
		d.decode(src, k, path+"."+k.path)
	}
	if r.Webhook.Provider != "" {
		r.webhookSettings()
	}
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
	s.ResponseHeaders.Exclude = slices.Clone(s.ResponseHeaders.Exclude)
	return s
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

// ParseSize reads a size written as in the config (512KiB, 25GiB, or a
// number of bytes), for the command line.
func ParseSize(s string) (int64, error) { return parseSize(s) }
