package config

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Every config key is declared once, as a tagged field of Config or of a
// struct below it: `yaml:"name"` names the key (nested structs add their
// own name and a dot; ",inline" adds nothing), and `reload:"true"` marks
// a key, or a whole section, that reloads; every other key needs a
// restart. Decoding, the environment overrides, the unknown-key check, the
// restart-only list and docs/configuration.md's reference table all come from these
// declarations. The Go type picks the decoder: string, bool, int,
// time.Duration, int64 (a size: bytes or KiB/MiB/GiB), []string, []int
// (HTTP statuses) and []netip.Prefix (CIDRs or addresses).

// key is one declared config key, bound to the field of one value.
type key struct {
	// path is the key's YAML path from the struct walked, e.g.
	// "store.redis.addrs" or, under a route, "fingerprint.headers".
	path string
	// field is the addressable field the key decodes into.
	field reflect.Value
	// reload reports whether a change takes effect without a restart.
	reload bool
}

// keysOf lists the keys declared in the struct v points to, in declaration
// order, their paths under prefix.
func keysOf(v any, prefix string) []key {
	return walk(reflect.ValueOf(v).Elem(), prefix, false, nil)
}

func walk(v reflect.Value, prefix string, reload bool, into []key) []key {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		name, ok := sf.Tag.Lookup("yaml")
		if !ok || name == "-" || !sf.IsExported() {
			continue
		}
		r := reload || sf.Tag.Get("reload") == "true"
		f := v.Field(i)
		if sf.Type.Kind() == reflect.Struct && sf.Type != reflect.TypeFor[time.Duration]() {
			sub := prefix + name + "."
			if name == ",inline" {
				sub = prefix
			}
			into = walk(f, sub, r, into)
			continue
		}
		into = append(into, key{path: prefix + name, field: f, reload: r})
	}
	return into
}

// keyPaths are the paths of every key of a Config, and of a route.
var (
	configKeyPaths = paths(keysOf(&Config{}, ""))
	routeKeyPaths  = paths(keysOf(&Route{}, ""))
)

func paths(keys []key) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.path
	}
	return out
}

// RestartOnly returns the paths of the keys whose value differs between
// old and next and that take effect only after a restart.
func RestartOnly(old, next *Config) []string {
	a, b := keysOf(old, ""), keysOf(next, "")
	var changed []string
	for i, k := range a {
		if !k.reload && !reflect.DeepEqual(k.field.Interface(), b[i].field.Interface()) {
			changed = append(changed, k.path)
		}
	}
	return changed
}

// Reference is docs/configuration.md's table of every key with its default and
// whether it reloads; meaning gives each key's prose, and routes' own
// keys follow the rest. It reports the keys meaning has no text for.
func reference(meaning map[string]string) (table string, undocumented []string) {
	var b strings.Builder
	b.WriteString("| key | default | reloads | meaning |\n|---|---|---|---|\n")
	row := func(path, def, reload string) {
		m := meaning[path]
		if strings.TrimSpace(m) == "" {
			undocumented = append(undocumented, path)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", path, def, reload, m)
	}
	for _, k := range keysOf(Default(), "") {
		reload := "restart"
		if k.reload {
			reload = "yes"
		}
		row(k.path, formatDefault(k.field), reload)
	}
	r := Route{Reconcile: defaultReconcile(), Stream: StreamAuto, Webhook: Webhook{Tolerance: DefaultWebhookTolerance}, Protocol: ProtocolHTTP, GRPC: GRPC{ReleaseCodes: defaultReleaseCodes()}}
	for _, k := range keysOf(&r, "") {
		switch {
		case k.path == "name" || k.path == "match":
			row("routes[]."+k.path, "required", "yes")
		case strings.HasPrefix(k.path, "reconcile."), strings.HasPrefix(k.path, "webhook."), k.path == "stream",
			k.path == "protocol", strings.HasPrefix(k.path, "grpc."):
			row("routes[]."+k.path, formatDefault(k.field), "yes")
		}
	}
	return b.String(), undocumented
}

// formatDefault writes a default value as the config file would.
func formatDefault(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case string:
		if x == "" {
			return "`\"\"`"
		}
		return "`" + x + "`"
	case time.Duration:
		s := x.String() // 24h0m0s, 5m0s, 30s, 100ms
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return "`" + s + "`"
	case int64:
		for _, u := range []struct {
			unit string
			n    int64
		}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
			if x >= u.n && x%u.n == 0 {
				return fmt.Sprintf("`%d%s`", x/u.n, u.unit)
			}
		}
		return fmt.Sprintf("`%d`", x)
	case []netip.Prefix:
		s := make([]string, len(x))
		for i, p := range x {
			s[i] = p.String()
		}
		return "`[" + strings.Join(s, ", ") + "]`"
	case []string:
		return "`[" + strings.Join(slices.Clone(x), ", ") + "]`"
	case float64:
		return fmt.Sprintf("`%g%%`", x*100)
	case []int:
		return "`" + strings.ReplaceAll(fmt.Sprint(x), " ", ", ") + "`"
	default:
		return fmt.Sprintf("`%v`", x)
	}
}
