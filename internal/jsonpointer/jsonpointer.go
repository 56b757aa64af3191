// Package jsonpointer parses JSON Pointers (RFC 6901).
package jsonpointer

import (
	"fmt"
	"strings"
)

// Parse splits a JSON Pointer (RFC 6901) such as "/metadata/attempt"
// into its unescaped reference tokens. The empty pointer, which names the
// whole document, is rejected: ignoring the whole body would make every
// request with the same key look identical.
func Parse(p string) ([]string, error) {
	if p == "" {
		return nil, fmt.Errorf("the empty JSON Pointer would ignore the whole body")
	}
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("%q is not a JSON Pointer: it must start with /", p)
	}
	parts := strings.Split(p[1:], "/")
	for i, part := range parts {
		for j := 0; j < len(part); j++ {
			if part[j] == '~' && (j+1 == len(part) || (part[j+1] != '0' && part[j+1] != '1')) {
				return nil, fmt.Errorf("%q is not a JSON Pointer: ~ must be followed by 0 or 1", p)
			}
		}
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
	}
	return parts, nil
}
