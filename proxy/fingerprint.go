package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/jsonpointer"
)

// fingerprinter hashes what makes two requests "the same request": method,
// the concrete path and query, the configured headers and the body. Every
// part is length-prefixed, so no two different requests frame to the same
// bytes.
type fingerprinter struct {
	// headers are canonical header names, in configured order.
	headers []string
	// ignore are parsed JSON Pointers removed from JSON bodies before
	// hashing; nil leaves bodies byte for byte.
	ignore [][]string
}

func newFingerprinter(headers, ignoreJSONFields []string) (*fingerprinter, error) {
	f := &fingerprinter{}
	for _, h := range headers {
		f.headers = append(f.headers, http.CanonicalHeaderKey(h))
	}
	for _, p := range ignoreJSONFields {
		tokens, err := jsonpointer.Parse(p)
		if err != nil {
			return nil, err
		}
		f.ignore = append(f.ignore, tokens)
	}
	return f, nil
}

// sum returns the fingerprint. path is the cleaned path the route matched.
func (f *fingerprinter) sum(method, path, rawQuery string, h http.Header, body []byte) claim.Fingerprint {
	d := sha256.New()
	frame(d, []byte(method))
	frame(d, []byte(path))
	frame(d, []byte(rawQuery))
	for _, name := range f.headers {
		vs := h.Values(name)
		frame(d, []byte(name))
		frame(d, []byte(strconv.Itoa(len(vs))))
		for _, v := range vs {
			if name == "Content-Type" {
				v = normalizeMediaType(v)
			}
			frame(d, []byte(v))
		}
	}
	if len(f.ignore) > 0 && isJSON(h.Get("Content-Type")) {
		if canon, ok := f.canonicalJSON(body); ok {
			frame(d, []byte("json"))
			frame(d, canon)
			return claim.Fingerprint(d.Sum(nil))
		}
	}
	frame(d, []byte("raw"))
	frame(d, body)
	return claim.Fingerprint(d.Sum(nil))
}

func frame(h hash.Hash, b []byte) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
	h.Write(b)
}

// normalizeMediaType lower-cases the type and parameter names and drops
// optional whitespace, so "Application/JSON; charset=utf-8" and
// "application/json;charset=utf-8" fingerprint alike.
func normalizeMediaType(v string) string {
	mt, params, err := mime.ParseMediaType(v)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(v))
	}
	return mime.FormatMediaType(mt, params)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// canonicalJSON removes the ignored fields and re-encodes the document
// with sorted object keys and numbers kept as written. ok is false for a
// body that is not exactly one JSON value, or that two different requests
// could share a canonical form with: invalid UTF-8 (the decoder would map
// every bad byte to U+FFFD) or a duplicated object key (parsers disagree on
// which value wins). Such a body is hashed raw, and the upstream decides
// what to answer to it.
func (f *fingerprinter) canonicalJSON(body []byte) (canon []byte, ok bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	doc, err := decodeStrict(dec)
	if err != nil {
		return nil, false
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) != 0 {
		return nil, false // trailing data after the document
	}
	for _, p := range f.ignore {
		doc = remove(doc, p)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, false
	}
	return out, true
}

var errDuplicateKey = errors.New("duplicate object key")

// decodeStrict decodes one JSON value token by token, refusing duplicate
// object keys, which json.Decoder.Decode silently resolves to the last.
func decodeStrict(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				if _, dup := obj[k]; dup {
					return nil, errDuplicateKey
				}
				if obj[k], err = decodeStrict(dec); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token() // '}'
			return obj, err
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decodeStrict(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token() // ']'
			return arr, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return tok, nil
	}
}

// remove deletes the value at pointer from doc. An array element is set
// to null rather than removed, so the elements after it keep their
// positions. A pointer that names nothing leaves doc unchanged.
func remove(doc any, pointer []string) any {
	if len(pointer) == 0 {
		return doc
	}
	last := len(pointer) == 1
	switch t := doc.(type) {
	case map[string]any:
		child, ok := t[pointer[0]]
		if !ok {
			return doc
		}
		if last {
			delete(t, pointer[0])
		} else {
			t[pointer[0]] = remove(child, pointer[1:])
		}
	case []any:
		i, err := strconv.Atoi(pointer[0])
		if err != nil || i < 0 || i >= len(t) || strconv.Itoa(i) != pointer[0] {
			return doc
		}
		if last {
			t[i] = nil
		} else {
			t[i] = remove(t[i], pointer[1:])
		}
	}
	return doc
}
