package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
)

// benchParallel drives the proxy from 16 concurrent clients.
func benchParallel(b *testing.B, path string, body []byte, keyed bool) {
	e := newEnv(b, created, nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var seq atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, e.front.URL+path, bytes.NewReader(body))
			req.Header.Set("X-Forwarded-User", "bench")
			if keyed {
				req.Header.Set("Idempotency-Key", "k"+strconv.FormatInt(seq.Add(1), 36))
			}
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

func BenchmarkParallelPassThrough(b *testing.B) {
	benchParallel(b, "/other", []byte(`{"amount":1}`), false)
}

func BenchmarkParallelFirstAttempt(b *testing.B) {
	benchParallel(b, "/payments", []byte(`{"amount":1}`), true)
}

func BenchmarkParallelFirstAttempt64KiB(b *testing.B) {
	benchParallel(b, "/payments", bytes.Repeat([]byte("a"), 64<<10), true)
}

// BenchmarkParallelPlainReverseProxy is the baseline for pass-through: a
// plain httputil.ReverseProxy with the same Transport, same upstream.
func BenchmarkParallelPlainReverseProxy(b *testing.B) {
	e := newEnv(b, created, nil)
	u, _ := url.Parse(e.upstream.URL)
	rp := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport:  proxy.NewTransport(),
		BufferPool: benchPool{},
	}
	front := httptest.NewServer(rp)
	defer front.Close()
	e.front = front
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	body := []byte(`{"amount":1}`)
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, front.URL+"/other", bytes.NewReader(body))
			req.Header.Set("X-Forwarded-User", "bench") // as benchParallel sends
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

type benchPool struct{}

var benchBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (benchPool) Get() []byte  { return *(benchBuffers.Get().(*[]byte)) }
func (benchPool) Put(b []byte) { benchBuffers.Put(&b) }
