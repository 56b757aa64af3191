package proxy

import (
	"net"
	"net/http"
	"net/http/httputil"
	"time"
)

// Transport sizing. The default http.Transport keeps 2 idle connections
// per host, which under concurrency means a new upstream connection for
// most requests.
const (
	maxIdleConnsPerHost = 512
	idleConnTimeout     = 60 * time.Second
	dialTimeout         = 5 * time.Second
)

// NewTransport returns the http.Transport idemproxy uses to reach the
// upstream in its own pod: plain HTTP/1.1, many idle connections, no
// environment proxy, and no transparent decompression (the client gets the
// upstream's bytes, encoded as they were).
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext: (&net.Dialer{
			Timeout:   dialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          maxIdleConnsPerHost,
		MaxIdleConnsPerHost:   maxIdleConnsPerHost,
		IdleConnTimeout:       idleConnTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}

// forwarder is a pair of ReverseProxies to the upstream: protected with
// the owner's hooks, which settle the claim, and direct for pass-through
// requests, with none.
type forwarder struct {
	protected, direct *httputil.ReverseProxy
}

// grpcAware sends gRPC calls (protected or passed through) over HTTP/2
// without TLS, which gRPC needs, and everything else as before.
type grpcAware struct {
	http1, h2c *http.Transport
}

func (t grpcAware) RoundTrip(req *http.Request) (*http.Response, error) {
	if isGRPC(req.Header.Get("Content-Type")) {
		return t.h2c.RoundTrip(req)
	}
	return t.http1.RoundTrip(req)
}

// h2cTransport is t speaking HTTP/2 with prior knowledge to http://
// upstreams (h2c), as gRPC servers without TLS expect.
func h2cTransport(t *http.Transport) *http.Transport {
	h2 := t.Clone()
	h2.Protocols = new(http.Protocols)
	h2.Protocols.SetUnencryptedHTTP2(true)
	return h2
}
