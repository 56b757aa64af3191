package proxy

import (
	"errors"
	"net/http"
	"strings"
)

// maxKeyLen is the longest idempotency key accepted, after unquoting.
const maxKeyLen = 255

var (
	errKeyMissing   = errors.New("no idempotency key")
	errKeyDuplicate = errors.New("the idempotency key header appears more than once")
	errKeyEmpty     = errors.New("the idempotency key is empty")
	errKeyTooLong   = errors.New("the idempotency key is longer than 255 characters")
	errKeyChars     = errors.New("the idempotency key must be visible ASCII characters (0x21-0x7E) only")
	errKeyQuoting   = errors.New(`the idempotency key is not a valid quoted string: "..." with only \" and \\ escaped, nothing after the closing quote`)
)

// parseKey extracts the idempotency key from the header named name. It
// accepts the IETF draft's Structured Field string ("abc") and the bare
// token Stripe's clients send (abc); either way the key is 1..255 visible
// ASCII characters. It returns errKeyMissing when the header is absent.
func parseKey(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch len(vs) {
	case 0:
		return "", errKeyMissing
	case 1:
	default:
		return "", errKeyDuplicate
	}
	v := strings.Trim(vs[0], " \t")
	if strings.HasPrefix(v, `"`) {
		var err error
		if v, err = unquote(v); err != nil {
			return "", err
		}
	}
	return checkKey(v)
}

// checkKey returns v when it is a key idemproxy takes: 1 to maxKeyLen
// visible ASCII characters.
func checkKey(v string) (string, error) {
	switch {
	case v == "":
		return "", errKeyEmpty
	case len(v) > maxKeyLen:
		return "", errKeyTooLong
	}
	if !visibleASCII(v) {
		return "", errKeyChars
	}
	return v, nil
}

// unquote decodes an RFC 8941 sf-string. Parameters after the string are
// not part of the key and are refused rather than silently dropped.
func unquote(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errKeyQuoting
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errKeyQuoting
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errKeyChars
		default:
			b.WriteByte(c)
		}
	}
	return "", errKeyQuoting
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
