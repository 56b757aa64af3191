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
	"sync"
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
// The framed parts before the body are built in a pooled buffer and
// hashed with the body by a pooled hasher: the same bytes as framing each
// part into the hash on its own, without an allocation per part.
func (f *fingerprinter) sum(method, path, rawQuery string, h http.Header, body []byte) claim.Fingerprint {
	s := sums.Get().(*summer)
	defer sums.Put(s)
	s.d.Reset()
	b := frame(s.buf[:0], method)
	b = frame(b, path)
	b = frame(b, rawQuery)
	for _, name := range f.headers {
		vs := h.Values(name)
		b = frame(b, name)
		b = frame(b, strconv.Itoa(len(vs)))
		for _, v := range vs {
			if name == "Content-Type" {
				v = normalizeMediaType(v)
			}
			b = frame(b, v)
		}
	}
	kind := "raw"
	if len(f.ignore) > 0 && isJSON(h.Get("Content-Type")) {
		if canon, ok := f.canonicalJSON(body); ok {
			kind, body = "json", canon
		}
	}
	b = frame(b, kind)
	b = binary.AppendUvarint(b, uint64(len(body)))
	s.d.Write(b)
	s.d.Write(body)
	if cap(b) <= maxSummerBuf {
		s.buf = b[:0]
	}
	var fp claim.Fingerprint
	s.d.Sum(fp[:0])
	return fp
}

// summer is a hasher and the buffer the framed parts go in, pooled.
type summer struct {
	d   hash.Hash
	buf []byte
}

// maxSummerBuf bounds the buffers kept (a request with huge fingerprinted
// headers does not hold its buffer in the pool).
const maxSummerBuf = 4 << 10

var sums = sync.Pool{New: func() any { return &summer{d: sha256.New(), buf: make([]byte, 0, 512)} }}

// frame appends part to b, length-prefixed.
func frame(b []byte, part string) []byte {
	b = binary.AppendUvarint(b, uint64(len(part)))
	return append(b, part...)
}

// normalizeMediaType lower-cases the type and parameter names and drops
// optional whitespace, so "Application/JSON; charset=utf-8" and
// "application/json;charset=utf-8" fingerprint alike.
func normalizeMediaType(v string) string {
	if plainMediaType(v) {
		return v // already what the rest would make of it (the usual case)
	}
	mt, params, err := mime.ParseMediaType(v)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(v))
	}
	return mime.FormatMediaType(mt, params)
}

// plainMediaType reports a media type without parameters, spaces or
// capitals ("application/json"): normalizeMediaType returns it as it is.
func plainMediaType(v string) bool {
	slash := false
	for i := range len(v) {
		switch c := v[i]; {
		case c == '/' && !slash && i > 0 && i < len(v)-1:
			slash = true
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '+', c == '.':
		default:
			return false
		}
	}
	return slash
}

func isJSON(contentType string) bool {
	if plainMediaType(contentType) {
		return contentType == "application/json" || strings.HasSuffix(contentType, "+json")
	}
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
