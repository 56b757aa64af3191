package proxy

import (
	"net/http"
	"net/netip"
	"testing"
)

func mustPrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestFingerprint(t *testing.T) {
	fp, err := newFingerprinter([]string{"content-type"}, []string{"/nonce", "/items/0/ts", "/a~1b"})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := newFingerprinter([]string{"Content-Type"}, nil)
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	base := fp.sum("POST", "/p", "", jsonCT, []byte(`{"amount":1,"nonce":"x","items":[{"ts":1,"n":2}],"a/b":1}`))
	same := []struct {
		name string
		f    *fingerprinter
		h    http.Header
		body string
	}{
		{"ignored fields changed", fp, jsonCT, `{"amount":1,"nonce":"y","items":[{"ts":9,"n":2}],"a/b":2}`},
		{"ignored fields absent", fp, jsonCT, `{"amount":1,"items":[{"n":2}]}`},
		{"keys reordered, whitespace", fp, jsonCT, ` { "items":[{"n":2,"ts":3}], "amount":1 } `},
		{"media type case and spacing", fp, http.Header{"Content-Type": {"Application/JSON"}}, `{"amount":1,"items":[{"n":2}]}`},
	}
	for _, tt := range same {
		if got := tt.f.sum("POST", "/p", "", tt.h, []byte(tt.body)); got != base {
			t.Errorf("%s: fingerprint differs, want equal", tt.name)
		}
	}
	different := []struct {
		name                string
		f                   *fingerprinter
		method, path, query string
		h                   http.Header
		body                string
	}{
		{"value changed", fp, "POST", "/p", "", jsonCT, `{"amount":2,"items":[{"n":2}]}`},
		{"number spelled differently", fp, "POST", "/p", "", jsonCT, `{"amount":1.0,"items":[{"n":2}]}`},
		{"other path", fp, "POST", "/q", "", jsonCT, `{"amount":1,"items":[{"n":2}]}`},
		{"other query", fp, "POST", "/p", "x=1", jsonCT, `{"amount":1,"items":[{"n":2}]}`},
		{"other method", fp, "PUT", "/p", "", jsonCT, `{"amount":1,"items":[{"n":2}]}`},
		{"other content type", fp, "POST", "/p", "", http.Header{"Content-Type": {"text/plain"}}, `{"amount":1,"items":[{"n":2}]}`},
		{"no ignore list: raw bytes", plain, "POST", "/p", "", jsonCT, `{"amount":1,"items":[{"n":2}]}`},
	}
	for _, tt := range different {
		if got := tt.f.sum(tt.method, tt.path, tt.query, tt.h, []byte(tt.body)); got == base {
			t.Errorf("%s: fingerprint equal, want different", tt.name)
		}
	}
	// Without an ignore list, bodies are compared byte for byte.
	a := plain.sum("POST", "/p", "", jsonCT, []byte(`{"a":1}`))
	if b := plain.sum("POST", "/p", "", jsonCT, []byte(`{"a": 1}`)); a == b {
		t.Error("raw bodies that differ fingerprint equal")
	}
	// Invalid JSON with an ignore list is hashed raw, not rejected.
	x := fp.sum("POST", "/p", "", jsonCT, []byte(`{"nonce":1`))
	y := fp.sum("POST", "/p", "", jsonCT, []byte(`{"nonce":2`))
	if x == y {
		t.Error("two different invalid JSON bodies fingerprint equal")
	}
	// Trailing data after a JSON document is not ignored.
	if fp.sum("POST", "/p", "", jsonCT, []byte(`{"amount":1,"items":[{"n":2}]} {"x":1}`)) == base {
		t.Error("trailing data after the document was ignored")
	}
	// Bodies whose canonical forms would collide are hashed raw instead.
	for _, pair := range [][2]string{
		{`{"amount":"\xff"}`, `{"amount":"\xfe"}`},  // both decode to U+FFFD
		{`{"amount":1,"amount":2}`, `{"amount":2}`}, // a parser taking the first value sees 1
		{`{"amount":2,"amount":1}`, `{"amount":1}`},
	} {
		if fp.sum("POST", "/p", "", jsonCT, []byte(pair[0])) == fp.sum("POST", "/p", "", jsonCT, []byte(pair[1])) {
			t.Errorf("%s and %s fingerprint equal", pair[0], pair[1])
		}
	}
	// Path and query are framed: moving a byte between them changes the sum.
	if fp.sum("POST", "/p?", "a", jsonCT, nil) == fp.sum("POST", "/p", "?a", jsonCT, nil) {
		t.Error("path and query are not framed")
	}
}
