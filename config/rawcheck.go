package config

import (
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Checks of the file as written, before viper folds it: viper matches
// keys case-insensitively, so `LISTEN:` beside `listen:` would leave one of
// them silently unused; and a value given where a section belongs
// (`upstream: "http://..."`) reads better said so than as an unknown key.

// caseTwins reports, for every mapping of the YAML document b, keys that
// differ only in case: one of each pair would be ignored. The YAML is
// already known to parse (viper read it).
func (d *decoder) caseTwins(b []byte) {
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) != nil || len(doc.Content) == 0 {
		return
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.MappingNode:
			seen := map[string]string{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				lower := strings.ToLower(k)
				child := lower
				if path != "" {
					child = path + "." + lower
				}
				if first, ok := seen[lower]; ok && first != k {
					d.errorf(child, "given twice, as %q and %q: keys are matched without regard to case, so one of them would be ignored", first, k)
				}
				seen[lower] = k
				walk(n.Content[i+1], child)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	walk(doc.Content[0], "")
}

// sectionOf reports whether k is a section of the config (a key with keys
// under it), and its first keys, for a value given in its place.
func sectionOf(k string) (children []string, ok bool) {
	seen := map[string]bool{}
	for _, p := range configKeyPaths {
		rest, found := strings.CutPrefix(p, k+".")
		if !found {
			continue
		}
		first, _, _ := strings.Cut(rest, ".")
		if !seen[first] {
			seen[first] = true
			children = append(children, first)
		}
	}
	sort.Strings(children)
	return children, len(children) > 0
}

// strayEnv are the IDEMPROXY_* variables of env that name no config key
// (a typo such as IDEMPROXY_LISTN leaves the default in force), leaving out
// those of the project's own tooling (tests, CI).
func strayEnv(env []string) []string {
	known := map[string]bool{}
	for _, p := range configKeyPaths {
		known[EnvPrefix+"_"+strings.ToUpper(strings.NewReplacer(".", "_").Replace(p))] = true
	}
	var stray []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || known[name] || toolingEnv(name) {
			continue
		}
		stray = append(stray, name)
	}
	sort.Strings(stray)
	return stray
}

// toolingEnv reports whether name is one of the variables the project's
// tests and CI read, which the binary never does.
func toolingEnv(name string) bool {
	for _, p := range []string{"IDEMPROXY_REQUIRE_", "IDEMPROXY_TEST_", "IDEMPROXY_UPDATE_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return name == "IDEMPROXY_BINARY" || name == "IDEMPROXY_IMAGE_CROSS"
}
