package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
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
