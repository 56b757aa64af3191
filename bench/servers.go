package main

import (
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// response is the upstream's ~1 KiB JSON answer.
var response = []byte(`{"id":"ch_0000000001","object":"charge","amount":1250,"currency":"eur","status":"succeeded","description":"` +
	strings.Repeat("x", 860) + `","metadata":{"order":"42"}}`)

// serveUpstream is the benchmark's upstream: it reads the body, waits its
// service time and answers ~1 KiB of JSON.
func serveUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "")
	delay := fs.Duration("delay", 0, "service time")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srv := &http.Server{Addr: *listen, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if *delay > 0 {
			time.Sleep(*delay)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(response)
	})}
	return srv.ListenAndServe()
}

// serveReverseProxy is the baseline: httputil.ReverseProxy with a Transport
// sized for the concurrency, and a buffer pool.
func serveReverseProxy(args []string) error {
	fs := flag.NewFlagSet("reverseproxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "")
	target := fs.String("upstream", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        512,
			MaxIdleConnsPerHost: 512,
			IdleConnTimeout:     60 * time.Second,
			DisableCompression:  true,
		},
		BufferPool: &bufferPool{pool: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}},
	}
	srv := &http.Server{Addr: *listen, Handler: rp, ReadHeaderTimeout: 5 * time.Second}
	return srv.ListenAndServe()
}

type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte  { return *(p.pool.Get().(*[]byte)) }
func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }
