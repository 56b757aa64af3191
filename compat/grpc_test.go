package compat

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/encoding/gzip" // the gzip compressor, by name
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// The gRPC method the tests call, without generated code: a request and
// an answer are google.protobuf.StringValue, whose field 1 (value) is the
// request's request_id (grpc.key_field: 1).
const (
	orderService = "shop.v1.Orders"
	createOrder  = "/" + orderService + "/CreateOrder"
)

// orders is a grpc-go upstream that counts executions by request id. A
// request id starting "flaky" answers UNAVAILABLE at its first execution;
// "refuse" answers FAILED_PRECONDITION with details; every answer carries
// trailing metadata naming its execution.
type orders struct {
	mu   sync.Mutex
	runs map[string]int
}

func (o *orders) executions(id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.runs[id]
}

func (o *orders) create(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	id := in.GetValue()
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("idempotency-key")) > 0 {
		id = md.Get("idempotency-key")[0]
	}
	o.mu.Lock()
	o.runs[id]++
	n := o.runs[id]
	o.mu.Unlock()
	grpc.SetTrailer(ctx, metadata.Pairs("x-execution", fmt.Sprint(n), "x-ledger-bin", "\x00\x01\x02"))
	switch {
	case strings.HasPrefix(id, "flaky") && n == 1:
		return nil, status.Error(codes.Unavailable, "warming up")
	case strings.HasPrefix(id, "refuse"):
		st, err := status.New(codes.FailedPrecondition, "card declined").WithDetails(wrapperspb.String("insufficient funds"))
		if err != nil {
			return nil, err
		}
		return nil, st.Err() // grpc-status-details-bin in the trailers
	}
	return wrapperspb.String(fmt.Sprintf("order %s, execution %d", id, n)), nil
}

// startOrders serves orders with grpc-go on a loopback port.
func startOrders(t *testing.T) (*orders, string) {
	o := &orders{runs: map[string]int{}}
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: orderService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "CreateOrder", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return o.create(ctx, in)
		}}},
	}, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return o, ln.Addr().String()
}

// grpcSidecars runs n sidecars on one store (redis or postgres) in front
// of upstream with a protocol: grpc route keyed by field 1.
func grpcSidecars(t *testing.T, store, upstream string, n int) []string {
	var storeYAML string
	if store == "redis" {
		storeYAML = fmt.Sprintf("  redis:\n    addrs: [%q]\n", redistest.Start(t).Addr)
	} else {
		storeYAML = fmt.Sprintf("  postgres:\n    url: %q\n", pgtest.Start(t).URL)
	}
	yaml := fmt.Sprintf(`upstream:
  url: "http://%s"
identity:
  source: header
  header: X-Forwarded-User
store:
%sroutes:
  - name: orders
    match: "POST %s"
    protocol: grpc
    grpc:
      key_field: 1
`, upstream, storeYAML, createOrder)
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = strings.TrimPrefix(binarytest.StartT(t, binary(t), yaml).Client, "http://")
	}
	return addrs
}

// dial is a grpc-go client of addrs: round-robin over them, retrying
// UNAVAILABLE as a retryPolicy does, the principal in its metadata.
func dial(t *testing.T, addrs ...string) *grpc.ClientConn {
	r := manual.NewBuilderWithScheme("sidecars")
	var state resolver.State
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	conn, err := grpc.NewClient(r.Scheme()+":///idemproxy",
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}],
		  "methodConfig":[{"name":[{"service":"`+orderService+`"}],
		    "retryPolicy":{"maxAttempts":4,"initialBackoff":"0.05s","maxBackoff":"0.5s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// answer is what a grpc-go caller gets of one call.
type answer struct {
	value             string
	code              codes.Code
	msg               string
	details           string // the status' details, as the client decoded grpc-status-details-bin
	header, trailer   metadata.MD
	replayed, problem string
}

func invoke(ctx context.Context, conn *grpc.ClientConn, id string, opts ...grpc.CallOption) answer {
	return invokeMsg(ctx, conn, wrapperspb.String(id), opts...)
}

// invokeMsg is invoke with the request message given.
func invokeMsg(ctx context.Context, conn *grpc.ClientConn, in *wrapperspb.StringValue, opts ...grpc.CallOption) answer {
	ctx = metadata.AppendToOutgoingContext(ctx, "x-forwarded-user", "alice")
	var a answer
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, createOrder, in, out, append(opts, grpc.Header(&a.header), grpc.Trailer(&a.trailer))...)
	st, _ := status.FromError(err)
	a.value, a.code, a.msg = out.GetValue(), st.Code(), st.Message()
	a.details = fmt.Sprint(st.Details())
	// A Trailers-Only answer (an error status) has its metadata in the
	// trailer as grpc-go reads it.
	if v := append(a.header.Get("idempotent-replayed"), a.trailer.Get("idempotent-replayed")...); len(v) > 0 {
		a.replayed = v[0]
	}
	if v := append(a.header.Get("idemproxy-problem"), a.trailer.Get("idemproxy-problem")...); len(v) > 0 {
		a.problem = v[0]
	}
	return a
}

// same reports whether two answers are the same call's: status, message,
// answer and trailers.
func same(a, b answer) bool {
	return a.code == b.code && a.msg == b.msg && a.value == b.value && a.details == b.details &&
		strings.Join(a.trailer.Get("x-execution"), ",") == strings.Join(b.trailer.Get("x-execution"), ",") &&
		strings.Join(a.trailer.Get("x-ledger-bin"), ",") == strings.Join(b.trailer.Get("x-ledger-bin"), ",")
}

// TestGRPCGo (issue 80): grpc-go through the real binary, on each store,
// three sidecars on one store: 200 keys over round-robin, each retried,
// execute once and replay the same status, message and trailers, marked
// idempotent-replayed; an UNAVAILABLE answer is released and retried by
// the retryPolicy; 200 keys' hedged copies (10 ms apart, one to each
// sidecar) run once and answer alike; gzip-compressed calls replay; another message under a key is
// FAILED_PRECONDITION from idemproxy.
func TestGRPCGo(t *testing.T) {
	for _, store := range []string{"redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			o, up := startOrders(t)
			addrs := grpcSidecars(t, store, up, 3)
			conn := dial(t, addrs...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			const keys = 200
			var wg sync.WaitGroup
			firsts, retries := make([]answer, keys), make([]answer, keys)
			for k := range keys {
				wg.Go(func() {
					id := fmt.Sprintf("req-%d", k)
					if k%10 == 0 {
						id = fmt.Sprintf("flaky-%d", k)
					}
					firsts[k] = invoke(ctx, conn, id)
					retries[k] = invoke(ctx, conn, id, grpc.UseCompressor("gzip"))
				})
			}
			wg.Wait()
			for k := range keys {
				id, want := fmt.Sprintf("req-%d", k), 1
				if k%10 == 0 {
					id, want = fmt.Sprintf("flaky-%d", k), 2 // UNAVAILABLE released, then retried by the policy
				}
				if n := o.executions(id); n != want {
					t.Errorf("%s executed %d times, want %d", id, n, want)
				}
				f, r := firsts[k], retries[k]
				if f.code != codes.OK || !same(f, r) || r.replayed != "true" {
					t.Errorf("%s: first %v %q %v, retry %v %q %v replayed %q: want one OK answer replayed", id, f.code, f.value, f.trailer, r.code, r.value, r.trailer, r.replayed)
				}
			}

			// Hedged copies as a hedging client sends them: 200 keys at
			// once, each sent three times 10 ms apart, one copy to each
			// sidecar.
			conns := []*grpc.ClientConn{dial(t, addrs[0]), dial(t, addrs[1]), dial(t, addrs[2])}
			hedged := make([][]answer, 200)
			for k := range hedged {
				hedged[k] = make([]answer, len(conns))
				for i, c := range conns {
					wg.Go(func() {
						time.Sleep(time.Duration(i) * 10 * time.Millisecond)
						hedged[k][i] = invoke(ctx, c, fmt.Sprintf("hedge-%d", k))
					})
				}
			}
			wg.Wait()
			for k, copies := range hedged {
				id := fmt.Sprintf("hedge-%d", k)
				if n := o.executions(id); n != 1 {
					t.Errorf("%s executed %d times, want 1", id, n)
				}
				for i, c := range copies {
					if !same(c, copies[0]) || c.code != codes.OK {
						t.Errorf("%s copy %d: %v %q %v, copy 0: %v %q %v", id, i, c.code, c.value, c.trailer, copies[0].code, copies[0].value, copies[0].trailer)
					}
				}
			}

			// An upstream's own error status is the answer, replayed.
			refused, again := invoke(ctx, conn, "refuse-1"), invoke(ctx, conn, "refuse-1")
			if refused.code != codes.FailedPrecondition || !strings.Contains(refused.details, "insufficient funds") || !same(refused, again) || again.replayed != "true" || o.executions("refuse-1") != 1 {
				t.Errorf("an error status with details: %v %q %s then %v %q %s replayed %q, %d executions", refused.code, refused.msg, refused.details, again.code, again.msg, again.details, again.replayed, o.executions("refuse-1"))
			}
			// The same key with another message: req-1 with a field 2.
			changed := wrapperspb.String("req-1")
			changed.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "more"))
			other := invokeMsg(ctx, conn, changed)
			if other.code != codes.FailedPrecondition || other.problem != "key-reused" {
				t.Errorf("another message under req-1: %v %q problem %q, want FAILED_PRECONDITION key-reused", other.code, other.msg, other.problem)
			}
		})
	}
}

// TestConnectGo (issue 80): connect-go's unary client through the binary
// on a protocol: connect route (Connect's protocol, JSON and proto, over
// HTTP/1.1 and HTTP/2 without TLS): one execution per key, the retry replayed; idemproxy's
// refusal read as a Connect error with its code.
func TestConnectGo(t *testing.T) {
	var mu sync.Mutex
	runs := map[string]int{}
	mux := http.NewServeMux()
	mux.Handle(createOrder, connect.NewUnaryHandler(createOrder, func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		key := req.Header().Get("Idempotency-Key")
		mu.Lock()
		runs[key]++
		n := runs[key]
		mu.Unlock()
		return connect.NewResponse(wrapperspb.String(fmt.Sprintf("%s execution %d", req.Msg.GetValue(), n))), nil
	}))
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	base := "http://" + strings.TrimPrefix(binarytest.StartT(t, binary(t), fmt.Sprintf(`upstream:
  url: %q
routes:
  - name: orders
    match: "POST %s"
    protocol: connect
`, up.URL, createOrder)).Client, "http://")
	h2c := &http.Client{Transport: &http.Transport{Protocols: new(http.Protocols)}}
	h2c.Transport.(*http.Transport).Protocols.SetUnencryptedHTTP2(true)
	for i, tc := range []struct {
		codec connect.ClientOption
		http  *http.Client
	}{{connect.WithProtoJSON(), http.DefaultClient}, {connect.WithClientOptions(), http.DefaultClient}, {connect.WithProtoJSON(), h2c}, {connect.WithClientOptions(), h2c}} {
		client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](tc.http, base+createOrder, tc.codec)
		key := fmt.Sprintf("c-%d", i) // JSON and proto, over HTTP/1.1 and over HTTP/2 without TLS
		var got []string
		for range 2 {
			req := connect.NewRequest(wrapperspb.String("order"))
			req.Header().Set("Idempotency-Key", key)
			req.Header().Set("X-Forwarded-User", "alice")
			resp, err := client.CallUnary(context.Background(), req)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			got = append(got, resp.Msg.GetValue()+" replayed="+resp.Header().Get("Idempotent-Replayed"))
		}
		mu.Lock()
		n := runs[key]
		mu.Unlock()
		if n != 1 || got[0] != "order execution 1 replayed=" || got[1] != "order execution 1 replayed=true" {
			t.Errorf("%s: %d executions, answers %q", key, n, got)
		}
		req := connect.NewRequest(wrapperspb.String("order"))
		req.Header().Set("X-Forwarded-User", "alice")
		_, err := client.CallUnary(context.Background(), req)
		var cerr *connect.Error
		if !errors.As(err, &cerr) || cerr.Code() != connect.CodeInvalidArgument || cerr.Meta().Get("Idemproxy-Problem") != "key-missing" {
			t.Errorf("without a key: %v, want a Connect invalid_argument error with idemproxy-problem key-missing", err)
		}
	}
}
