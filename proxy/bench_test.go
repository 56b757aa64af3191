package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

var benchBody = []byte(`{"amount":1250,"currency":"EUR","customer":"cus_42","description":"order 42","nonce":"a1b2c3"}`)

func BenchmarkFingerprintRaw(b *testing.B) {
	fp, _ := newFingerprinter([]string{"Content-Type"}, nil)
	h := http.Header{"Content-Type": {"application/json; charset=utf-8"}}
	b.ReportAllocs()
	for b.Loop() {
		fp.sum("POST", "/payments", "", h, benchBody)
	}
}

func BenchmarkFingerprintCanonicalJSON(b *testing.B) {
	fp, _ := newFingerprinter([]string{"Content-Type"}, []string{"/nonce"})
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

// benchMatch matches method and path against two POST routes.
func benchMatch(b *testing.B, method, path string) {
	rt, _ := newRouter([]Route{
		testRoute("a", "POST /payments"),
		testRoute("b", "POST /orders/{id}/capture"),
	})
	r, _ := http.NewRequest(method, path, nil)
	b.ReportAllocs()
	for b.Loop() {
		rt.match(r)
	}
}

func BenchmarkRouteMatch(b *testing.B) {
	benchMatch(b, "POST", "/orders/"+strings.Repeat("9", 12)+"/capture")
}

// BenchmarkRouteMatchOtherMethod is pass-through traffic with a method no
// route uses (a GET in front of POST routes): it never reaches the mux.
func BenchmarkRouteMatchOtherMethod(b *testing.B) {
	benchMatch(b, "GET", "/orders/"+strings.Repeat("9", 12)+"/capture")
}

// BenchmarkRouteMatchOtherPath is pass-through traffic with a method the
// routes use on a path none of them matches (a POST /other in front of
// POST routes).
func BenchmarkRouteMatchOtherPath(b *testing.B) {
	benchMatch(b, "POST", "/other")
}

func BenchmarkIdentity(b *testing.B) {
	id := newIdentity(Identity{Header: "X-Forwarded-User", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}}, nil)
	r, _ := http.NewRequest("POST", "/other", nil)
	r.RemoteAddr = "127.0.0.1:53124"
	r.Header.Set("X-Forwarded-User", "alice")
	b.ReportAllocs()
	for b.Loop() {
		id.principal(r)
	}
}

// cannedTransport answers every request at once with a ~1 KiB JSON body,
// so the handler benchmarks below measure the proxy's own CPU per request
// with no network, client or upstream in the loop.
type cannedTransport struct{}

var cannedBody = bytes.Repeat([]byte("x"), 1000)

func (cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{
		StatusCode:    http.StatusCreated,
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(cannedBody)),
		ContentLength: int64(len(cannedBody)),
		Request:       r,
	}, nil
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// benchHandler serves pass-through requests, as the client listener would
// hand them over, through h.
func benchHandler(b *testing.B, h http.Handler) {
	body := []byte(`{"amount":1250,"currency":"EUR","customer":"cus_42","description":"order 42"}`)
	w := &discardWriter{h: http.Header{}}
	r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/other", nil)
	r.RemoteAddr = "127.0.0.1:53124"
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Forwarded-User", "bench")
	var br bytes.Reader
	b.ReportAllocs()
	for b.Loop() {
		br.Reset(body)
		r.Body = io.NopCloser(&br)
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}

// BenchmarkHandlerPassThrough and BenchmarkHandlerPlainReverseProxy put a
// pass-through request through idemproxy's handler and through a plain
// httputil.ReverseProxy, on the same canned transport: the difference is
// idemproxy's own CPU per pass-through request.
func BenchmarkHandlerPassThrough(b *testing.B) {
	cfg := testConfig("http://127.0.0.1:9")
	cfg.Routes = []Route{testRoute("a", "POST /payments"), testRoute("b", "POST /orders/{id}/capture")}
	h, err := New(cfg, nil, Options{Transport: cannedTransport{}})
	if err != nil {
		b.Fatal(err)
	}
	benchHandler(b, h)
}

func BenchmarkHandlerPlainReverseProxy(b *testing.B) {
	u, _ := url.Parse("http://127.0.0.1:9")
	benchHandler(b, &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport:  cannedTransport{},
		BufferPool: newBufferPool(),
	})
}
