package config

import (
	"net/netip"
	"reflect"
	"strings"
	"time"
)

// JSONSchema is the configuration's shape as a JSON Schema (draft 7, what
// helm checks values against): every key by its YAML name and type, and
// no other key, at every level, routes included. The Helm chart's
// values.schema.json carries it under config (a test keeps the two
// equal), so that a typo or a wrong type in a chart value fails helm lint
// --strict instead of a pod's start. Values that idemproxy parses
// (durations, sizes, shares) are checked for their form; the ranges are
// Validate's.
func JSONSchema() map[string]any {
	root := objectSchema(reflect.TypeFor[Config]())
	route := objectSchema(reflect.TypeFor[Route]())
	route["required"] = []any{"name", "match"}
	root["properties"].(map[string]any)["routes"] = map[string]any{"type": "array", "items": route}
	root["description"] = "idemproxy's own config (docs/configuration.md), generated from its declarations; idemproxy -check validates the values"
	return root
}

// durationPattern is a Go duration (time.ParseDuration's syntax).
const durationPattern = `^[-+]?(0|([0-9]*\.?[0-9]+(ns|us|µs|ms|s|m|h))+)$`

// objectSchema is the schema of a struct's YAML keys; inline fields add
// theirs to it.
func objectSchema(t reflect.Type) map[string]any {
	props := map[string]any{}
	addFields(t, props)
	return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
}

func addFields(t reflect.Type, props map[string]any) {
	for i := range t.NumField() {
		sf := t.Field(i)
		tag, ok := sf.Tag.Lookup("yaml")
		if !ok || tag == "-" || !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if strings.Contains(tag, "inline") {
			addFields(sf.Type, props)
			continue
		}
		props[name] = leafSchema(sf.Type)
	}
}

func leafSchema(t reflect.Type) map[string]any {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return map[string]any{"type": "string", "pattern": durationPattern}
	case reflect.TypeFor[[]netip.Prefix]():
		return map[string]any{"type": "array", "items": map[string]any{"type": "string"}}
	}
	switch t.Kind() {
	case reflect.Struct:
		return objectSchema(t)
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int:
		return map[string]any{"type": "integer"}
	case reflect.Int64: // a size: bytes, or 1MiB
		return map[string]any{"type": []any{"integer", "string"}, "pattern": `^ *[0-9]+ *(B|KiB|MiB|GiB)? *$`}
	case reflect.Float64: // a share: 90% or 0.9
		return map[string]any{"type": []any{"number", "string"}, "pattern": `^ *[0-9]*\.?[0-9]+ *%? *$`}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": leafSchema(t.Elem())}
	}
	panic("config: no schema for " + t.String()) // a declaration error, caught by every test
}
