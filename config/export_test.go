package config

// Test-only exports.

// ParseSize reads a byte size written as in the config file: a plain
// number of bytes or a KiB, MiB or GiB suffix.
func ParseSize(s string) (int64, error) { return parseSize(s) }

// Reference renders the README's config reference table (reference).
var Reference = reference
