package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// This file speaks gRPC's wire format by hand (length-prefixed messages
// over HTTP/2 without TLS, the status in trailers), so that the root
// module needs no gRPC library; the real clients (grpc-go, connect-go)
// run in their own module.

// grpcUpstream is a unary gRPC server that counts executions by the
// idempotency key it is forwarded: each answers a message naming its
// execution, status OK (or the status the request message asks for
// with "status=N" at its end) and custom trailing metadata.
type grpcUpstream struct {
	URL  string
	mu   sync.Mutex
	runs map[string]int
	all  atomic.Int64
}

func newGRPCUpstream(t *testing.T) *grpcUpstream {
	u := &grpcUpstream{runs: map[string]int{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

func (u *grpcUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.ProtoMajor != 2 || len(body) < 5 {
		http.Error(w, "not a gRPC call over HTTP/2", http.StatusBadRequest)
		return
	}
	msg := body[5:]
	if body[0] == 1 {
		zr, _ := gzip.NewReader(bytes.NewReader(msg))
		msg, _ = io.ReadAll(zr)
	}
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.runs[key]++
	n := u.runs[key]
	u.mu.Unlock()
	u.all.Add(1)
	status := "0"
	if _, s, ok := strings.Cut(string(msg), "status="); ok {
		status = s
	}
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("X-Upstream", "yes")
	w.WriteHeader(http.StatusOK)
	w.Write(grpcFrame(fmt.Appendf(nil, "execution %d of %s", n, key)))
	w.Header().Set(http.TrailerPrefix+"Grpc-Status", status)
	w.Header().Set(http.TrailerPrefix+"Grpc-Message", "done%20here")
	w.Header().Set(http.TrailerPrefix+"X-Ledger-Bin", "AAEC")
}

func (u *grpcUpstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// grpcFrame is msg as a gRPC length-prefixed message, uncompressed.
func grpcFrame(msg []byte) []byte {
	out := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

// grpcGzipFrame is msg gzip-compressed, as a length-prefixed message.
func grpcGzipFrame(msg []byte) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(msg)
	zw.Close()
	out := grpcFrame(b.Bytes())
	out[0] = 1
	return out
}

// protoString is a protobuf message holding s in field n.
func protoString(n int, s string) []byte {
	b := binary.AppendUvarint(nil, uint64(n)<<3|2)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// grpcAnswer is what a gRPC client reads of an answer: headers, the
// body's bytes and trailers (a Trailers-Only answer's status is in its
// headers).
type grpcAnswer struct {
	header, trailer http.Header
	body            []byte
}

// status is the answer's grpc-status.
func (a grpcAnswer) status() string {
	if s := a.trailer.Get("Grpc-Status"); s != "" {
		return s
	}
	return a.header.Get("Grpc-Status")
}

var h2cClient = &http.Client{Transport: func() *http.Transport {
	t := &http.Transport{}
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}()}

// callGRPC makes a unary call to method on base with body (framed), the
// metadata given.
func callGRPC(t *testing.T, base, method string, body []byte, md ...string) grpcAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+method, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("X-Forwarded-User", "alice")
	for i := 0; i+1 < len(md); i += 2 {
		req.Header.Set(md[i], md[i+1])
	}
	resp, err := h2cClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: HTTP/%d %d %s, want an HTTP/2 200 as gRPC answers", method, resp.ProtoMajor, resp.StatusCode, b)
	}
	return grpcAnswer{header: resp.Header, trailer: resp.Trailer, body: b}
}

// TestGRPCUnaryThroughTheBinary (issue 80): a protocol: grpc route on
// each store, spoken to over HTTP/2 without TLS: a call executes once
// and its replay carries the same message and trailers, marked
// idempotent-replayed; per-attempt metadata and compression do not change
// the fingerprint, another message under the key is FAILED_PRECONDITION;
// UNAVAILABLE frees the key (and ABORTED, which the route's release_codes
// add, while RESOURCE_EXHAUSTED, which they leave out, is stored); a key
// comes from grpc.key_field without the metadata; refusals are Trailers-Only statuses with idemproxy-problem,
// and nothing reaches the upstream for them.
func TestGRPCUnaryThroughTheBinary(t *testing.T) {
	t.Parallel()
	binarytest.TestBinary(t)
	for _, store := range []string{"redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			up := newGRPCUpstream(t)
			var storeYAML string
			if store == "redis" {
				storeYAML = fmt.Sprintf("  redis:\n    addrs: [%q]\n", redistest.Start(t).Addr)
			} else {
				storeYAML = fmt.Sprintf("  postgres:\n    url: %q\n", pgtest.Start(t).URL)
			}
			sc := binarytest.T(t, fmt.Sprintf(`upstream:
  url: %q
store:
%sroutes:
  - name: orders
    match: "POST /shop.v1.Orders/CreateOrder"
    protocol: grpc
    grpc:
      key_field: 1
      release_codes: [UNAVAILABLE, ABORTED]
  - name: quotes
    match: "POST /shop.v1.Orders/GetQuote"
    protocol: connect
`, up.URL, storeYAML))
			const method = "/shop.v1.Orders/CreateOrder"
			msg := protoString(2, "order-1") // field 1 is the request_id, unset: the metadata keys it
			first := callGRPC(t, sc.Client, method, grpcFrame(msg), "Idempotency-Key", "k1", "Grpc-Timeout", "5S")
			if first.status() != "0" || !bytes.Contains(first.body, []byte("execution 1 of k1")) || first.trailer.Get("X-Ledger-Bin") != "AAEC" {
				t.Fatalf("first call: status %q (%s %s) body %q trailers %v", first.status(), first.header.Get("Idemproxy-Problem"), first.header.Get("Grpc-Message"), first.body, first.trailer)
			}
			// A retry as grpc-go sends one: another attempt count, another
			// deadline, the message gzip-compressed.
			again := callGRPC(t, sc.Client, method, grpcGzipFrame(msg), "Idempotency-Key", "k1", "Grpc-Previous-Rpc-Attempts", "1", "Grpc-Timeout", "3S", "Grpc-Encoding", "gzip", "User-Agent", "grpc-go/1.70")
			if !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry: body %q replayed %q, want %q replayed", again.body, again.header.Get("Idempotent-Replayed"), first.body)
			}
			for _, k := range []string{"Grpc-Status", "Grpc-Message", "X-Ledger-Bin"} {
				if got, want := again.trailer.Values(k), first.trailer.Values(k); strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("retry's trailer %s: %q, want %q", k, got, want)
				}
			}
			if n := up.executions("k1"); n != 1 {
				t.Errorf("k1 executed %d times, want 1", n)
			}
			// The same key with another message.
			other := callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "order-2")), "Idempotency-Key", "k1")
			if other.status() != "9" || other.header.Get("Idemproxy-Problem") != "key-reused" || len(other.body) != 0 {
				t.Errorf("another message under k1: status %q problem %q body %q, want a Trailers-Only 9 key-reused", other.status(), other.header.Get("Idemproxy-Problem"), other.body)
			}
			// The key from field 1 of the message, without the metadata.
			byField := callGRPC(t, sc.Client, method, grpcFrame(protoString(1, "req-7")))
			byFieldAgain := callGRPC(t, sc.Client, method, grpcFrame(protoString(1, "req-7")))
			if byField.status() != "0" || !bytes.Equal(byField.body, byFieldAgain.body) || up.executions("req-7") != 1 {
				t.Errorf("keyed by field 1: %q then %q, %d executions, want one execution replayed", byField.body, byFieldAgain.body, up.executions("req-7"))
			}
			// UNAVAILABLE frees the key: the retry executes again.
			for range 2 {
				callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "status=14")), "Idempotency-Key", "k-unavail")
			}
			if n := up.executions("k-unavail"); n != 2 {
				t.Errorf("an UNAVAILABLE answer: %d executions after two calls, want 2 (released)", n)
			}
			// The route's own release_codes, not the default: ABORTED
			// frees the key, RESOURCE_EXHAUSTED (a default one) is stored.
			for code, want := range map[string]int{"10": 2, "8": 1} {
				key := "k-status-" + code
				for range 2 {
					callGRPC(t, sc.Client, method, grpcFrame(protoString(2, "status="+code)), "Idempotency-Key", key)
				}
				if n := up.executions(key); n != want {
					t.Errorf("grpc-status %s with release_codes [UNAVAILABLE, ABORTED]: %d executions after two calls, want %d", code, n, want)
				}
			}
			// Refusals: no key, two messages, a bad key.
			before := up.all.Load()
			for _, tc := range []struct {
				name, status, problem string
				body                  []byte
				md                    []string
			}{
				{"no key", "3", "key-missing", grpcFrame(protoString(2, "no key here")), nil},
				{"two messages", "3", "call-invalid", append(grpcFrame(msg), grpcFrame(msg)...), []string{"Idempotency-Key", "k2"}},
				{"an unknown encoding", "3", "call-invalid", append([]byte{1}, grpcFrame(msg)[1:]...), []string{"Idempotency-Key", "k3", "Grpc-Encoding", "snappy"}},
			} {
				a := callGRPC(t, sc.Client, method, tc.body, tc.md...)
				if a.status() != tc.status || a.header.Get("Idemproxy-Problem") != tc.problem || a.header.Get("Grpc-Message") == "" {
					t.Errorf("%s: status %q problem %q message %q, want %s %s", tc.name, a.status(), a.header.Get("Idemproxy-Problem"), a.header.Get("Grpc-Message"), tc.status, tc.problem)
				}
			}
			// A Connect unary call reads idemproxy's refusal as a Connect
			// error.
			resp, body := postWith(t, sc.Client+"/shop.v1.Orders/GetQuote", "alice", "", `{"sku":"a"}`, nil)
			if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/json" || !strings.HasPrefix(body, `{"code":"invalid_argument","message":"Idempotency key required: `) || resp.Header.Get("Idemproxy-Problem") != "key-missing" {
				t.Errorf("a Connect call without a key: %d %s %q, want 400 and Connect's invalid_argument", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			if n := up.all.Load() - before; n != 0 {
				t.Errorf("refused calls reached the upstream %d times", n)
			}
		})
	}
}

// TestGRPCHedgedCopiesExecuteOnce (issue 80): hedged copies of one call,
// as a hedging client sends them (identical, 10 ms apart, each to another
// sidecar of three on one store), under concurrent: wait (a grpc route's
// default): one execution per key, and every copy gets the same status,
// message and trailers.
func TestGRPCHedgedCopiesExecuteOnce(t *testing.T) {
	t.Parallel()
	binarytest.TestBinary(t)
	up := newGRPCUpstream(t)
	store := redistest.Start(t)
	cfg := fmt.Sprintf("upstream:\n  url: %q\nstore:\n  redis:\n    addrs: [%q]\nroutes:\n  - name: orders\n    match: \"POST /shop.v1.Orders/CreateOrder\"\n    protocol: grpc\n", up.URL, store.Addr)
	var scs [3]*sidecar
	for i := range scs {
		scs[i] = binarytest.T(t, cfg)
	}
	const keys = 40
	var wg sync.WaitGroup
	answers := make([][3]grpcAnswer, keys)
	for k := range keys {
		for i, sc := range scs {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 10 * time.Millisecond)
				answers[k][i] = callGRPC(t, sc.Client, "/shop.v1.Orders/CreateOrder", grpcFrame(protoString(2, fmt.Sprintf("order %d", k))), "Idempotency-Key", fmt.Sprintf("hedge-%d", k))
			})
		}
	}
	wg.Wait()
	for k := range keys {
		key := fmt.Sprintf("hedge-%d", k)
		if n := up.executions(key); n != 1 {
			t.Errorf("%s executed %d times, want 1", key, n)
		}
		a := answers[k]
		for i := range a {
			if a[i].status() != "0" || !bytes.Equal(a[i].body, a[0].body) || a[i].trailer.Get("X-Ledger-Bin") != "AAEC" {
				t.Errorf("%s, copy %d: status %q (%s) body %q trailers %v; copy 0: %q", key, i, a[i].status(), a[i].header.Get("Idemproxy-Problem"), a[i].body, a[i].trailer, a[0].body)
			}
		}
	}
}
