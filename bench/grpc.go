package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
)

// The gRPC targets (issue 80): unary calls over HTTP/2 without TLS to a
// plain HTTP/2 ReverseProxy and to idemproxy's protocol: grpc route, the
// upstream answering each with one ~1 KiB message and grpc-status 0 in
// its trailers.

// grpcMethod is the method the gRPC targets call.
const grpcMethod = "/shop.v1.Orders/CreateOrder"

// grpcRoute is the route idemproxy's gRPC targets add to its config.
const grpcRoute = `  - name: orders
    match: "POST ` + grpcMethod + `"
    protocol: grpc
`

// grpcFrame is msg as one length-prefixed gRPC message.
func grpcFrame(msg []byte) []byte {
	out := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

// grpcAnswer is the upstream's answer to a gRPC call: response as one
// message, the status in the trailers.
var grpcAnswer = grpcFrame(response)

func serveGRPC(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
	w.WriteHeader(http.StatusOK)
	w.Write(grpcAnswer)
	w.Header().Set("Grpc-Status", "0")
	w.Header().Set("Grpc-Message", "")
}

// h2cProtocols are HTTP/1.1 and HTTP/2 without TLS, for a server; h2c
// alone for a client.
func h2cProtocols(http1 bool) *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(http1)
	p.SetUnencryptedHTTP2(true)
	return p
}

// isGRPCRequest reports a gRPC call.
func isGRPCRequest(r *http.Request) bool {
	return r.Header.Get("Content-Type") == "application/grpc"
}

// sendGRPC makes req a unary gRPC call: an error unless answered with
// grpc-status 0.
func sendGRPC(client *http.Client, req *http.Request) error {
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if st := resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status"); resp.StatusCode != http.StatusOK || st != "0" {
		return fmt.Errorf("HTTP %d grpc-status %q", resp.StatusCode, st)
	}
	return nil
}

// h2cClient is a load generator's client for gRPC targets.
func h2cClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, DisableCompression: true, Protocols: h2cProtocols(false)}}
}

// grpcSeeder stores 1,000 calls of body (keys prefix-0...) and returns
// their keys for replays.
func grpcSeeder(prefix string, body []byte) func(base string) ([]string, error) {
	return func(base string) ([]string, error) {
		client := h2cClient(1)
		defer client.CloseIdleConnections()
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s-%d", prefix, i)
			req, _ := http.NewRequest(http.MethodPost, base+grpcMethod, bytes.NewReader(body))
			req.Header.Set("X-Forwarded-User", "bench")
			req.Header.Set("Idempotency-Key", keys[i])
			if err := sendGRPC(client, req); err != nil {
				return nil, err
			}
		}
		return keys, nil
	}
}

// grpcTargets are the plain HTTP/2 ReverseProxy and idemproxy's gRPC
// first attempts and replays, in one run.
func (st starters) grpcTargets(bin string) []*target {
	msg := grpcFrame([]byte(`order 42: 1250 EUR for cus_42`))
	idem := func() (*proc, error) {
		port, admin := freePort(), freePort()
		a := fmt.Sprintf("127.0.0.1:%d", port)
		cfg := filepath.Join(st.dir, "idemproxy-grpc.yaml")
		if err := os.WriteFile(cfg, append(fmt.Appendf(nil, idemproxyConfig, a, admin, "info", st.upURL, true, st.redisAddr), grpcRoute...), 0o644); err != nil {
			return nil, err
		}
		return startIdemproxy(bin, cfg, port, admin, nil)
	}
	plain := func() (*proc, error) {
		a := fmt.Sprintf("127.0.0.1:%d", freePort())
		return startProc("reverseproxy", a, st.self, "reverseproxy", "-listen", a, "-upstream", st.upURL, "-h2c")
	}
	return []*target{
		{name: "gRPC: HTTP/2 ReverseProxy", start: plain, path: grpcMethod, body: msg, grpc: true},
		{name: "gRPC: idemproxy first attempts", start: idem, path: grpcMethod, body: msg, grpc: true, keyed: true},
		{name: "gRPC: idemproxy replays", start: idem, path: grpcMethod, body: msg, grpc: true, prepare: grpcSeeder("grpc-replay", msg)},
	}
}
