package config

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Values: each kind of value a key holds (strings, booleans, integers,
// durations, sizes, percentages, prefixes and lists of them), read from the
// YAML or the environment into its field, a bad one reported by its path.

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
