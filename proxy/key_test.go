package proxy

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"bare token", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"sf-string", []string{`"8e03978e"`}, "8e03978e", nil},
		{"sf-string with escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"surrounding whitespace", []string{"  abc\t"}, "abc", nil},
		{"255 chars", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), nil},
		{"missing", nil, "", errKeyMissing},
		{"duplicate header", []string{"a", "b"}, "", errKeyDuplicate},
		{"empty", []string{""}, "", errKeyEmpty},
		{"empty sf-string", []string{`""`}, "", errKeyEmpty},
		{"256 chars", []string{strings.Repeat("k", 256)}, "", errKeyTooLong},
		{"space inside", []string{"a b"}, "", errKeyChars},
		{"space in sf-string", []string{`"a b"`}, "", errKeyChars},
		{"control char", []string{"a\x01b"}, "", errKeyChars},
		{"non-ascii", []string{"clé"}, "", errKeyChars},
		{"non-ascii in sf-string", []string{`"clé"`}, "", errKeyChars},
		{"unterminated", []string{`"abc`}, "", errKeyQuoting},
		{"parameters", []string{`"abc";v=1`}, "", errKeyQuoting},
		{"bad escape", []string{`"a\nb"`}, "", errKeyQuoting},
		{"lone quote", []string{`"`}, "", errKeyQuoting},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Idempotency-Key", v)
			}
			got, err := parseKey(h, "Idempotency-Key")
			if got != tt.want || !errors.Is(err, tt.err) {
				t.Errorf("parseKey(%q) = %q, %v; want %q, %v", tt.values, got, err, tt.want, tt.err)
			}
		})
	}
}

func TestIdentityTrust(t *testing.T) {
	id := newIdentity(Identity{Header: "X-Forwarded-User", TrustedProxies: mustPrefixes("127.0.0.0/8", "::1/128", "10.1.0.0/16", "fd00::/8")}, nil)
	for _, tt := range []struct {
		remote string
		want   bool
	}{
		{"127.0.0.1:5000", true},
		{"[::1]:5000", true},
		{"[::ffff:127.0.0.1]:5000", true},
		{"10.1.2.3:80", true},
		{"10.2.0.1:80", false},
		{"[fe80::1%eth0]:80", false},
		{"[fd00::1%eth0]:80", true},
		{"10.1.2.3", true}, // no port: a custom listener's RemoteAddr
		{"::1", true},
		{"garbage", false},
		{"", false},
	} {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		r.RemoteAddr = tt.remote
		r.Header.Set("X-Forwarded-User", "alice")
		got, trusted, err := id.principal(r)
		if err != nil {
			t.Fatal(err)
		}
		if (got == "alice") != tt.want || trusted != tt.want {
			t.Errorf("%s: principal %q, trusted %v; want trusted %v", tt.remote, got, trusted, tt.want)
		}
		if !tt.want && r.Header.Get("X-Forwarded-User") != "" {
			t.Errorf("%s: header not stripped from an untrusted peer", tt.remote)
		}
	}
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	r.RemoteAddr = "127.0.0.1:1"
	r.Header.Add("X-Forwarded-User", "alice")
	r.Header.Add("X-Forwarded-User", "bob")
	if _, _, err := id.principal(r); !errors.Is(err, errIdentityAmbiguous) {
		t.Errorf("two identity headers: %v, want errIdentityAmbiguous", err)
	}
}
