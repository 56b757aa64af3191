package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/idemproxy/idemproxy/internal/jsonpointer"
)

// Keys taken from the body (key_json_pointer): many legacy clients already
// send a unique request id in the body ("request_id", "order_ref") and
// cannot be changed to send a header. The member must hold a string or an
// integer (written as its decimal form), under the same rules as the
// header; a body that is not JSON, or lacks the member, has no key.

var (
	errBodyKeyType     = errors.New("the idempotency key in the body must be a string or an integer")
	errBodyKeyDup      = errors.New("the JSON body has a member more than once: which value is the key is ambiguous (parsers disagree)")
	errBodyKeyTrailing = errors.New("the JSON body has data after its end")
)

// bodyKey returns the key at pointer in a JSON body; found is false when
// the body is not JSON or has no such member. A body the fingerprint
// would not read as one JSON document (a duplicated member, data after
// the document) is an error: the key must be read as strictly as the
// body is fingerprinted, or one request could name two keys.
func bodyKey(body []byte, pointer []string) (key string, found bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	doc, err := decodeStrict(dec)
	switch {
	case errors.Is(err, errDuplicateKey):
		return "", false, errBodyKeyDup
	case err != nil:
		return "", false, nil // not JSON: no key
	case len(bytes.TrimSpace(body[dec.InputOffset():])) != 0:
		return "", false, errBodyKeyTrailing
	}
	for _, tok := range pointer {
		switch v := doc.(type) {
		case map[string]any:
			if doc, found = v[tok]; !found {
				return "", false, nil
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return "", false, nil
			}
			doc = v[i]
		default:
			return "", false, nil
		}
	}
	switch v := doc.(type) {
	case string:
		key = v
	case json.Number:
		n, err := strconv.ParseInt(v.String(), 10, 64)
		if err != nil {
			return "", true, errBodyKeyType
		}
		key = strconv.FormatInt(n, 10)
	default:
		return "", true, errBodyKeyType
	}
	switch {
	case key == "":
		return "", true, errKeyEmpty
	case len(key) > maxKeyLen:
		return "", true, errKeyTooLong
	case !visibleASCII(key):
		return "", true, errKeyChars
	}
	return key, true, nil
}

// keyPointer is a route's key_json_pointer, parsed; nil when unset.
func keyPointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	return jsonpointer.Parse(p)
}
