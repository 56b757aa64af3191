package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
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
			if children, ok := sectionOf(k); ok {
				d.errorf(k, "must be a mapping (with %s), got a single value", strings.Join(children, ", "))
				continue
			}
			d.errorf(k, "unknown key")
		}
	}
}

// removedKeys are keys earlier versions accepted, with what replaced them.
var removedKeys = map[string]string{
	"admin_pprof": "removed: pprof is served only on its own loopback listener; set admin_pprof_listen: 127.0.0.1:6060",
}

func (d *decoder) route(m map[string]any, path string, defaults Settings) Route {
	r := Route{Settings: clone(defaults), set: map[string]bool{}, Webhook: Webhook{Tolerance: DefaultWebhookTolerance}, Reconcile: defaultReconcile(), Stream: StreamAuto, Protocol: ProtocolHTTP, GRPC: GRPC{ReleaseCodes: defaultReleaseCodes()}}
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
	if r.Protocol == ProtocolGRPC && !r.set["concurrent"] {
		// Hedged copies arrive together at different sidecars: each waits
		// for the first one's answer instead of failing.
		r.Settings.Concurrent = ConcurrentWait
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
