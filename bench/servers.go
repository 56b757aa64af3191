package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/http/pprof"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// response is the upstream's ~1 KiB JSON answer.
var response = []byte(`{"id":"ch_0000000001","object":"charge","amount":1250,"currency":"eur","status":"succeeded","description":"` +
	strings.Repeat("x", 860) + `","metadata":{"order":"42"}}`)

// serveUpstream is the benchmark's upstream: it reads the body, waits its
// service time and answers ~1 KiB of JSON. With -limit it serves at most
// that many POST /payments at once (the rest queue for a slot, as behind a
// connection pool); other paths are not limited. It counts executions per
// Idempotency-Key with -count and reports them at GET /_executions.
func serveUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "")
	delay := fs.Duration("delay", 0, "service time")
	limit := fs.Int("limit", 0, "POST /payments served at once (0: no limit)")
	count := fs.Bool("count", false, "count executions per Idempotency-Key (GET /_executions)")
	streamEvents := fs.Int("stream-events", 20, "POST /stream: events per streamed answer")
	streamGap := fs.Duration("stream-gap", 5*time.Millisecond, "POST /stream: pause between events")
	streamSize := fs.Int("stream-size", 200, "POST /stream: bytes per event")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var slots chan struct{}
	if *limit > 0 {
		slots = make(chan struct{}, *limit)
	}
	var execs executions
	execs.per = map[string]int{}
	srv := &http.Server{Addr: *listen, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_executions" {
			execs.report(w)
			return
		}
		io.Copy(io.Discard, r.Body)
		if isGRPCRequest(r) {
			if *delay > 0 {
				time.Sleep(*delay)
			}
			serveGRPC(w)
			return
		}
		if r.URL.Path == "/stream" {
			// Server-sent events, one flush each (an LLM endpoint's tokens).
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			ev := []byte("data: " + strings.Repeat("t", max(*streamSize-8, 1)) + "\n\n")
			rc := http.NewResponseController(w)
			for i := range *streamEvents {
				if i > 0 {
					time.Sleep(*streamGap)
				}
				w.Write(ev)
				rc.Flush()
			}
			return
		}
		if slots != nil && r.URL.Path == "/payments" {
			slots <- struct{}{}
			defer func() { <-slots }()
		}
		if key := r.Header.Get("Idempotency-Key"); *count && key != "" {
			execs.add(key)
		}
		if *delay > 0 {
			time.Sleep(*delay)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(response)
	}), Protocols: h2cProtocols(true)}
	return srv.ListenAndServe()
}

// executions counts the upstream's executions per key.
type executions struct {
	mu         sync.Mutex
	per        map[string]int
	duplicates int
}

func (e *executions) add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.per[key]++
	if e.per[key] > 1 {
		e.duplicates++
	}
}

func (e *executions) report(w http.ResponseWriter) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(w, `{"keys":%d,"duplicates":%d}`, len(e.per), e.duplicates)
}

// serveReverseProxy is the baseline: httputil.ReverseProxy with a Transport
// sized for the concurrency, and a buffer pool.
func serveReverseProxy(args []string) error {
	fs := flag.NewFlagSet("reverseproxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "")
	target := fs.String("upstream", "", "")
	redisAddr := fs.String("redis", "", "add the floor of idempotency: two Redis round trips per keyed request")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof here, to profile the baseline as the sidecar is profiled")
	storeCalls := fs.Bool("store-floor", false, "with -redis: store streams with idemproxy's own Redis store calls (storeFloor)")
	native := fs.Bool("native-append", false, "with -store-floor: append each read with one XADD in place of the fenced script (nativeStream)")
	h2c := fs.Bool("h2c", false, "HTTP/2 without TLS on both sides (the gRPC targets' plain proxy)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		go func() { _ = http.ListenAndServe(*pprofAddr, mux) }()
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
	var h http.Handler = rp
	switch {
	case *redisAddr != "" && *storeCalls:
		if h, err = newStoreFloor(rp, *redisAddr, *native); err != nil {
			return err
		}
	case *redisAddr != "":
		h = newFloor(rp, *redisAddr)
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	if *h2c {
		rp.Transport.(*http.Transport).Protocols = h2cProtocols(false)
		srv.Protocols = h2cProtocols(true)
	}
	return srv.ListenAndServe()
}

// floor is the least any Redis-backed idempotency layer does on a first
// attempt, with none of idemproxy's checks: claim the key with one native
// command, forward, buffer the answer, store it with a fenced script
// before answering. No identity, key validation, fingerprint, record
// encoding, lease renewal, metrics or logs. What idemproxy costs beyond
// this is its own; what this costs beyond ReverseProxy is the price of the
// two round trips on this machine.
type floor struct {
	rp    *httputil.ReverseProxy
	rdb   *redis.Client
	store *redis.Script
}

type floorToken struct{}

func newFloor(rp *httputil.ReverseProxy, addr string) *floor {
	f := &floor{
		rp:  rp,
		rdb: redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true}),
		store: redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 0`),
	}
	rp.ModifyResponse = f.complete
	return f
}

func (f *floor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		f.rp.ServeHTTP(w, r)
		return
	}
	var b [16]byte
	rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	key = "floor:" + key
	old, err := f.rdb.SetArgs(r.Context(), key, token, redis.SetArgs{Mode: "NX", TTL: 30 * time.Second, Get: true}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		ctx := context.WithValue(r.Context(), floorToken{}, [2]string{key, token})
		f.rp.ServeHTTP(w, r.WithContext(ctx))
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		// A replay: the stored body, with the status and type the bench
		// upstream always answers (the floor stores nothing else).
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(old))
	}
}

func (f *floor) complete(resp *http.Response) error {
	kt, ok := resp.Request.Context().Value(floorToken{}).([2]string)
	if !ok {
		return nil
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// A stream's floor (issue 65): each read of the answer stored
		// before it is sent, one APPEND per read, nothing else.
		ctx, key := resp.Request.Context(), kt[0]+":stream"
		resp.Body = &appending{ReadCloser: resp.Body, add: func(p []byte) error { return f.rdb.Append(ctx, key, string(p)).Err() }}
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if err := f.store.Run(resp.Request.Context(), f.rdb, []string{kt[0]}, kt[1], body, 3600000).Err(); err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return nil
}

// appending is a streamed answer's body in the floors: every read is
// stored (add) before ReverseProxy writes it on, and the end, when the
// floor records one (end, or nil), at the upstream's end.
type appending struct {
	io.ReadCloser
	add func(p []byte) error
	end func() error
}

func (a *appending) Read(p []byte) (int, error) {
	n, err := a.ReadCloser.Read(p)
	if n > 0 {
		if serr := a.add(p[:n]); serr != nil {
			return 0, serr
		}
	}
	if errors.Is(err, io.EOF) && a.end != nil {
		if serr := a.end(); serr != nil {
			return n, serr
		}
	}
	return n, err
}

type bufferPool struct{ pool sync.Pool }

func (p *bufferPool) Get() []byte  { return *(p.pool.Get().(*[]byte)) }
func (p *bufferPool) Put(b []byte) { p.pool.Put(&b) }
