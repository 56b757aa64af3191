package proxy

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

var benchBody = []byte(`{"amount":1250,"currency":"EUR","customer":"cus_42","description":"order 42","nonce":"a1b2c3"}`)

func BenchmarkFingerprintRaw(b *testing.B) {
	fp, _ := newFingerprinter(config.Fingerprint{Headers: []string{"Content-Type"}})
	h := http.Header{"Content-Type": {"application/json; charset=utf-8"}}
	b.ReportAllocs()
	for b.Loop() {
		fp.sum("POST", "/payments", "", h, benchBody)
	}
}

func BenchmarkFingerprintCanonicalJSON(b *testing.B) {
	fp, _ := newFingerprinter(config.Fingerprint{Headers: []string{"Content-Type"}, IgnoreJSONFields: []string{"/nonce"}})
	h := http.Header{"Content-Type": {"application/json"}}
	b.ReportAllocs()
	for b.Loop() {
		fp.sum("POST", "/payments", "", h, benchBody)
	}
}

func BenchmarkParseKey(b *testing.B) {
	h := http.Header{"Idempotency-Key": {`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}}
	b.ReportAllocs()
	for b.Loop() {
		parseKey(h, "Idempotency-Key")
	}
}

func BenchmarkRouteMatch(b *testing.B) {
	rt, _ := newRouter([]config.Route{
		{Name: "a", Match: "POST /payments", Settings: config.DefaultSettings()},
		{Name: "b", Match: "POST /orders/{id}/capture", Settings: config.DefaultSettings()},
	})
	r, _ := http.NewRequest("POST", "/orders/"+strings.Repeat("9", 12)+"/capture", nil)
	b.ReportAllocs()
	for b.Loop() {
		rt.match(r)
	}
}

// BenchmarkRouteMatchOtherMethod is pass-through traffic with a method no
// route uses (a GET in front of POST routes): it never reaches the mux.
func BenchmarkRouteMatchOtherMethod(b *testing.B) {
	rt, _ := newRouter([]config.Route{
		{Name: "a", Match: "POST /payments", Settings: config.DefaultSettings()},
		{Name: "b", Match: "POST /orders/{id}/capture", Settings: config.DefaultSettings()},
	})
	r, _ := http.NewRequest("GET", "/orders/"+strings.Repeat("9", 12)+"/capture", nil)
	b.ReportAllocs()
	for b.Loop() {
		rt.match(r)
	}
}

// BenchmarkRouteMatchOtherPath is pass-through traffic with a method the
// routes use on a path none of them matches (a POST /other in front of
// POST routes).
func BenchmarkRouteMatchOtherPath(b *testing.B) {
	rt, _ := newRouter([]config.Route{
		{Name: "a", Match: "POST /payments", Settings: config.DefaultSettings()},
		{Name: "b", Match: "POST /orders/{id}/capture", Settings: config.DefaultSettings()},
	})
	r, _ := http.NewRequest("POST", "/other", nil)
	b.ReportAllocs()
	for b.Loop() {
		rt.match(r)
	}
}

func BenchmarkIdentity(b *testing.B) {
	id := identity{header: "X-Forwarded-User", trusted: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}}
	r, _ := http.NewRequest("POST", "/other", nil)
	r.RemoteAddr = "127.0.0.1:53124"
	r.Header.Set("X-Forwarded-User", "alice")
	b.ReportAllocs()
	for b.Loop() {
		id.principal(r)
	}
}
