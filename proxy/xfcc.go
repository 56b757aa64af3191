package proxy

import (
	"errors"
	"strings"
)

// xFCCHeader is where Envoy (Istio) hands the peer's client certificate.
const xFCCHeader = "X-Forwarded-Client-Cert"

var errXFCC = errors.New("malformed " + xFCCHeader)

// xfccPrincipal returns the workload identity in an XFCC header value: the
// first URI SAN (spiffe://...) of the last element, the one the proxy in
// this pod added for the peer that connected to it. The other fields (Hash,
// Cert, Subject) change with every certificate rotation and would orphan
// the principal's keys. "" when the element has no URI.
func xfccPrincipal(v string) (string, error) {
	elements, err := splitQuoted(v, ',')
	if err != nil || len(elements) == 0 {
		return "", errXFCC
	}
	pairs, err := splitQuoted(elements[len(elements)-1], ';')
	if err != nil {
		return "", errXFCC
	}
	for _, p := range pairs {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			return "", errXFCC
		}
		if strings.EqualFold(strings.TrimSpace(k), "URI") {
			return unquoteXFCC(strings.TrimSpace(val))
		}
	}
	return "", nil
}

// splitQuoted splits s at sep outside double quotes (in which \" and \\
// escape).
func splitQuoted(s string, sep byte) ([]string, error) {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	if quoted {
		return nil, errXFCC
	}
	return append(parts, s[start:]), nil
}

func unquoteXFCC(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		return v, nil
	}
	if len(v) < 2 || !strings.HasSuffix(v, `"`) {
		return "", errXFCC
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		if v[i] == '\\' && i+1 < len(v)-1 {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String(), nil
}
