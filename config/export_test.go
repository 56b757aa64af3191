package config

// Test-only exports.

// Reference renders docs/configuration.md's config reference table (reference).
var Reference = reference

// Leaves returns every key of c (not routes) by its YAML path, with its
// value.
func Leaves(c *Config) map[string]any {
	out := map[string]any{}
	for _, k := range keysOf(c, "") {
		out[k.path] = k.field.Interface()
	}
	return out
}

// ExposedSecrets is c.exposedSecrets.
func ExposedSecrets(c *Config, groups func() ([]int, error)) []string {
	return c.exposedSecrets(groups)
}
