package proxy

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, `""`, `"`, "", " k ", `"x";p=1`, "clé", strings.Repeat("k", 256), "a,b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := parseKey(http.Header{"Idempotency-Key": {v}}, "Idempotency-Key")
		if err != nil {
			return
		}
		if len(key) < 1 || len(key) > maxKeyLen || !visibleASCII(key) {
			t.Fatalf("parseKey(%q) accepted %q", v, key)
		}
		// The two accepted forms name the same key.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, err := parseKey(http.Header{"Idempotency-Key": {quoted}}, "Idempotency-Key")
		if err != nil || again != key {
			t.Fatalf("sf-string form %q of %q parsed as %q, %v", quoted, key, again, err)
		}
	})
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"a":1,"nonce":"x"}`, `[1,{"nonce":2}]`, `{"items":[{"ts":1}]}`, `{"a":`, `1e999`, `"\ud800"`, `{"a":1}{"b":2}`, `  null `} {
		f.Add([]byte(s))
	}
	fp, err := newFingerprinter(nil, []string{"/nonce", "/items/0/ts", "/1/nonce"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		canon, ok := fp.canonicalJSON(body)
		if !ok {
			return
		}
		// Canonical form is a fixed point: canonicalising it again changes
		// nothing, so equal requests always hash equal.
		again, ok := fp.canonicalJSON(canon)
		if !ok || !bytes.Equal(again, canon) {
			t.Fatalf("canonical form of %q is not stable: %q then %q (ok=%v)", body, canon, again, ok)
		}
		h := http.Header{"Content-Type": {"application/json"}}
		if fp.sum("POST", "/p", "", h, body) != fp.sum("POST", "/p", "", h, canon) {
			t.Fatalf("%q and its canonical form %q fingerprint differently", body, canon)
		}
	})
}

// FuzzIdentityHeaders: from an untrusted peer, no spelling of the identity
// header or of a stripped header survives, whatever else the request
// holds; sameName agrees with the CGI mapping (upper case, '-' as '_').
func FuzzIdentityHeaders(f *testing.F) {
	for _, name := range []string{"X-Forwarded-User", "X_Forwarded_User", "x-forwarded_user", "X-Real-Ip", "X_REAL_IP", "Idempotency-Key", "X-Forwarded-Use", "X-Forwarded-Userx", ""} {
		f.Add(name, "victim", "Other")
	}
	id := newIdentity(Identity{Header: "X-Forwarded-User", StripFromUntrusted: []string{"X-Real-Ip", "True-Client-Ip"}}, nil)
	cgi := func(s string) string { // ASCII upper case, '-' as '_', other bytes as they are
		b := []byte(s)
		for i, c := range b {
			switch {
			case c == '-':
				b[i] = '_'
			case 'a' <= c && c <= 'z':
				b[i] = c - 'a' + 'A'
			}
		}
		return string(b)
	}
	f.Fuzz(func(t *testing.T, name, value, other string) {
		if sameName(name, other) != (cgi(name) == cgi(other)) || sameName(name, other) != sameName(other, name) {
			t.Fatalf("sameName(%q, %q) = %v, CGI names %q %q", name, other, sameName(name, other), cgi(name), cgi(other))
		}
		r := &http.Request{RemoteAddr: "192.0.2.1:1234", Header: http.Header{name: {value}, other: {value}}}
		if p, trusted, err := id.principal(r); p != "" || trusted || err != nil {
			t.Fatalf("untrusted peer: principal %q, trusted %v, err %v", p, trusted, err)
		}
		for k := range r.Header {
			if cgi(k) == cgi(id.header) || cgi(k) == "X_REAL_IP" || cgi(k) == "TRUE_CLIENT_IP" {
				t.Fatalf("header %q survived from an untrusted peer", k)
			}
		}
	})
}
