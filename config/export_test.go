package config

// Test-only exports.

// Reference renders the README's config reference table (reference).
var Reference = reference
