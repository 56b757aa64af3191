package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/idemproxy/idemproxy/config"
)

// demoPort is where the demo's sidecar listens when the port is free, so
// the printed curl lines are easy to type.
const demoPort = "127.0.0.1:8080"

// runDemo starts the embedded store, a sample legacy payments upstream and
// the sidecar on loopback, runs a scripted show of the guarantees, then
// keeps serving until interrupted (or returns at once with -once).
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idemproxy demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	once := fs.Bool("once", false, "exit after the scripted show")
	verbose := fs.Bool("v", false, "print the sidecar's JSON logs")
	listen := fs.String("listen", demoPort, "the sidecar's client address; the default falls back to a free port when taken, a given one must be free")
	if help, err := parseFlags(fs, args, "demo takes only flags"); help || err != nil {
		return err
	}

	bank := newLegacyBank()
	upstreamLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	upstream := &http.Server{Handler: bank, ReadHeaderTimeout: 5 * time.Second, Protocols: clientProtocols()}
	go upstream.Serve(upstreamLn)
	defer upstream.Close()

	// The webhook route's signing secret, in a file as a mounted Secret is.
	dir, err := os.MkdirTemp("", "idemproxy-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	secretFile := filepath.Join(dir, "webhook-secret")
	if err := os.WriteFile(secretFile, []byte(demoWebhookSecret), 0o600); err != nil {
		return err
	}

	cfg := config.Default()
	if cfg.Listen, err = demoListen(*listen, flagGiven(fs, "listen")); err != nil {
		return err
	}
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Upstream.URL = "http://" + upstreamLn.Addr().String()
	cfg.Upstream.Timeout = 5 * time.Second
	cfg.Defaults.Lease = 2 * time.Second
	cfg.Defaults.Retention = time.Hour
	cfg.Store.RecordFormat = 4 // streamed answers stored as they arrive (one process: no older replica)
	wait := cfg.Defaults
	wait.Concurrent = config.ConcurrentWait
	cfg.Routes = []config.Route{
		{Name: "create-payment", Match: "POST /payments", Settings: cfg.Defaults, Reconcile: config.Reconcile{
			URL: "/payments/by-key/{key}", Found: []int{200}, Absent: []int{404}, Status: http.StatusCreated,
			Timeout: 2 * time.Second, AbsentAfter: 10 * time.Minute,
		}},
		{Name: "create-order", Match: "POST /orders", Settings: wait},
		{Name: "place-order", Match: "POST " + demoGRPCMethod, Settings: wait, Protocol: config.ProtocolGRPC},
		{Name: "generate", Match: "POST /v1/chat/completions", Settings: cfg.Defaults, Stream: config.StreamAuto},
		{Name: "payment-events", Match: "POST /webhooks/payments", Settings: cfg.Defaults,
			Webhook: config.Webhook{Provider: config.WebhookGitHub, Tolerance: config.DefaultWebhookTolerance, SecretFiles: []string{secretFile}, Events: []string{"push"}}},
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	logOut := io.Discard
	if *verbose {
		logOut = stderr
	}
	logger := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	srv, err := start(sctx, cfg, "", logger)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.wait(sctx) }()
	client, admin := srv.clientAddr, srv.adminAddr

	fmt.Fprintf(stdout, "idemproxy demo: sidecar http://%s -> legacy payments upstream %s (embedded store)\n\n", client, cfg.Upstream.URL)
	show := &demoShow{base: "http://" + client, bank: bank, out: stdout}
	if err := show.run(); err != nil {
		stop()
		<-served
		return err
	}
	if *once {
		stop()
		return <-served
	}
	fmt.Fprintf(stdout, `
Try it yourself (Ctrl-C to stop):
  curl -i -X POST http://%[1]s/payments -H 'X-Forwarded-User: alice' -H 'Idempotency-Key: try-1' -H 'Content-Type: application/json' -d '{"amount":500}'
  # run it again: same body, Idempotent-Replayed: true, still one charge
  curl -i -X POST http://%[1]s/payments -H 'X-Forwarded-User: alice' -H 'Idempotency-Key: try-1' -H 'Content-Type: application/json' -d '{"amount":999}'
  # 422: the key was used for a different request
  curl -s http://%[2]s/metrics | grep idemproxy_requests_total
`, client, admin)
	return <-served
}

// demoShow is the scripted part of the demo.
type demoShow struct {
	base string
	bank *legacyBank
	out  io.Writer
	rows [][4]string
	// lastBody is the success body of the last burst, to compare replays.
	lastBody string
}

type demoResult struct {
	status     int
	replayed   bool
	reconciled bool
	body       string
}

func (s *demoShow) post(path, user, key, body string) (demoResult, error) {
	req, err := http.NewRequest(http.MethodPost, s.base+path, strings.NewReader(body))
	if err != nil {
		return demoResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if user != "" {
		req.Header.Set("X-Forwarded-User", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return send(req)
}

// send sends req and reads what the client saw.
func send(req *http.Request) (demoResult, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return demoResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return demoResult{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", reconciled: resp.Header.Get("Idempotent-Reconciled") == "true", body: string(b)}, err
}

// burst sends n identical requests at once and tallies the answers.
func (s *demoShow) burst(n int, path, user, key, body string) (string, error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	tally := map[string]int{}
	bodies := map[string]bool{}
	var firstErr error
	for range n {
		wg.Go(func() {
			r, err := s.post(path, user, key, body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			label := fmt.Sprint(r.status)
			if r.replayed {
				label += " replayed"
			}
			tally[label]++
			if r.status < 300 {
				bodies[r.body] = true
				s.lastBody = r.body
			}
		})
	}
	wg.Wait()
	var parts []string
	for _, label := range []string{"201", "201 replayed", "409"} {
		if tally[label] > 0 {
			parts = append(parts, fmt.Sprintf("%d x %s", tally[label], label))
		}
		delete(tally, label)
	}
	for label, c := range tally {
		parts = append(parts, fmt.Sprintf("%d x %s", c, label))
	}
	return fmt.Sprintf("%s; %d distinct success body", strings.Join(parts, ", "), len(bodies)), firstErr
}

// demoWebhookSecret signs the demo's webhook deliveries (GitHub's format).
const demoWebhookSecret = "demo-webhook-secret"

// webhook delivers body as GitHub would, signed with secret.
func (s *demoShow) webhook(id, body, secret string) (demoResult, error) {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	req, err := http.NewRequest(http.MethodPost, s.base+"/webhooks/payments", strings.NewReader(body))
	if err != nil {
		return demoResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Delivery", id)
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)))
	return send(req)
}

func (s *demoShow) row(step, result string) {
	s.rows = append(s.rows, [4]string{fmt.Sprint(len(s.rows) + 1), step, result, fmt.Sprint(s.bank.charges())})
}

func (s *demoShow) run() error {
	const pay = `{"amount":1250,"currency":"EUR"}`
	res, err := s.burst(20, "/payments", "alice", "order-42", pay)
	if err != nil {
		return err
	}
	s.row("20 concurrent retries, one key (reject mode)", res)

	r, err := s.post("/payments", "alice", "order-42", pay)
	if err != nil {
		return err
	}
	same := "a different body"
	if r.body == s.lastBody {
		same = "byte-identical body"
	}
	s.row("a later retry of the same request", fmt.Sprintf("%d, Idempotent-Replayed: %v, %s", r.status, r.replayed, same))

	r, err = s.post("/payments", "alice", "order-42", `{"amount":9999,"currency":"EUR"}`)
	if err != nil {
		return err
	}
	s.row("same key, different amount", fmt.Sprintf("%d key-reused (nothing charged)", r.status))

	r, err = s.post("/payments", "bob", "order-42", pay)
	if err != nil {
		return err
	}
	s.row("another principal, same key", fmt.Sprintf("%d: keys are scoped by principal", r.status))

	r, err = s.post("/payments", "alice", "busy-1", `{"amount":300,"simulate":"busy_once"}`)
	if err != nil {
		return err
	}
	r2, err := s.post("/payments", "alice", "busy-1", `{"amount":300,"simulate":"busy_once"}`)
	if err != nil {
		return err
	}
	s.row("upstream 503 (transient), then a retry", fmt.Sprintf("%d released, retry %d executed", r.status, r2.status))

	res, err = s.burst(10, "/orders", "alice", "cart-7", `{"sku":"book"}`)
	if err != nil {
		return err
	}
	s.row("10 concurrent retries (concurrent: wait)", res)

	r, err = s.post("/payments", "alice", "", pay)
	if err != nil {
		return err
	}
	s.row("no Idempotency-Key on a required route", fmt.Sprintf("%d key-missing", r.status))

	// The bank charges, then its connection dies before it answers: the
	// sidecar asks the bank (reconcile) instead of answering 502.
	lost := `{"amount":700,"simulate":"reset_after_charge"}`
	r, err = s.post("/payments", "alice", "lost-1", lost)
	if err != nil {
		return err
	}
	r2, err = s.post("/payments", "alice", "lost-1", lost)
	if err != nil {
		return err
	}
	s.row("charged, then the connection died (reconcile)", fmt.Sprintf("%d with the real charge (reconciled: %v), retry %d replayed: %v", r.status, r.reconciled, r2.status, r2.replayed))

	// A streamed answer (an LLM endpoint's SSE): relayed event by event,
	// and a retry while it runs attaches instead of generating again.
	line, err := s.streamed()
	if err != nil {
		return err
	}
	s.row("a streamed answer (SSE), a retry while it streams", line)

	// A webhook: the provider redelivers; a forgery never reaches the app.
	event := `{"action":"paid","amount":800}`
	forged, err := s.webhook("dlv-1", event, "not-the-secret")
	if err != nil {
		return err
	}
	first, err := s.webhook("dlv-1", event, demoWebhookSecret)
	if err != nil {
		return err
	}
	again, err := s.webhook("dlv-1", event, demoWebhookSecret)
	if err != nil {
		return err
	}
	s.row("a forged webhook, the real one, its redelivery", fmt.Sprintf("%d signature-invalid, %d executed, %d replayed: %v", forged.status, first.status, again.status, again.replayed))
	if err := s.hedged(); err != nil {
		return err
	}
	return s.table()
}

// table prints the rows.
func (s *demoShow) table() error {
	tw := tabwriter.NewWriter(s.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tscenario\tclient saw\tcharges made upstream so far")
	for _, row := range s.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", row[0], row[1], row[2], row[3])
	}
	return tw.Flush()
}

// streamed opens a streamed generation, reads its first event while the
// bank still streams, retries the same key mid-stream, and compares what
// both clients got.
func (s *demoShow) streamed() (string, error) {
	open := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, s.base+"/v1/chat/completions", strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-User", "alice")
		req.Header.Set("Idempotency-Key", "gen-1")
		return http.DefaultClient.Do(req)
	}
	first, err := open()
	if err != nil {
		return "", err
	}
	defer first.Body.Close()
	r := bufio.NewReader(first.Body)
	ev, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	early := !s.bank.streamDone()
	retry, err := open()
	if err != nil {
		return "", err
	}
	defer retry.Body.Close()
	rest, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	again, err := io.ReadAll(retry.Body)
	if err != nil {
		return "", err
	}
	whole := ev + string(rest)
	return fmt.Sprintf("%d, first event before the last was generated: %v; the retry attached (Idempotent-Replayed: %v), same %d events: %v",
		first.StatusCode, early, retry.Header.Get("Idempotent-Replayed") == "true", strings.Count(whole, "data: "), string(again) == whole), nil
}

// legacyBank is the demo's unmodified upstream: it charges on every POST
// it receives, slowly, with no idempotency of its own. It keeps each
// charge's answer by principal and key, as the README asks, and answers
// GET /payments/by-key/{key} from it: the reconcile lookup.
type legacyBank struct {
	mu      sync.Mutex
	n       int
	busy    map[string]bool
	answers map[string][]byte
	// streaming is set while a generation streams.
	streaming bool
}

func newLegacyBank() *legacyBank {
	return &legacyBank{busy: map[string]bool{}, answers: map[string][]byte{}}
}

// lookup answers what the bank did for the key: 200 and the charge's
// answer, or 404; either echoes the key.
func (b *legacyBank) lookup(w http.ResponseWriter, r *http.Request, key string) {
	b.mu.Lock()
	answer, ok := b.answers[r.Header.Get("X-Forwarded-User")+"\x00"+key]
	b.mu.Unlock()
	w.Header().Set("Idempotency-Key", key)
	if !ok {
		http.Error(w, `{"error":"no charge for this key"}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(answer)
}

// generate is a billed generation streamed as server-sent events, one
// word every 150 ms: each execution is a charge.
func (b *legacyBank) generate(w http.ResponseWriter) {
	b.mu.Lock()
	b.n++
	b.streaming = true
	b.mu.Unlock()
	defer func() { b.mu.Lock(); b.streaming = false; b.mu.Unlock() }()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, word := range []string{"Your", "payment", "is", "safe."} {
		fmt.Fprintf(w, "data: {\"delta\":%q}\n\n", word)
		http.NewResponseController(w).Flush()
		time.Sleep(150 * time.Millisecond)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// streamDone reports whether no generation is streaming now.
func (b *legacyBank) streamDone() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.streaming
}

func (b *legacyBank) charges() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *legacyBank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if key, ok := strings.CutPrefix(r.URL.Path, "/payments/by-key/"); ok && r.Method == http.MethodGet {
		b.lookup(w, r, key)
		return
	}
	if r.URL.Path == "/v1/chat/completions" {
		b.generate(w)
		return
	}
	if r.URL.Path == demoGRPCMethod {
		b.placeOrder(w, r)
		return
	}
	var in map[string]any
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &in)
	key := r.Header.Get("Idempotency-Key")
	b.mu.Lock()
	if in["simulate"] == "busy_once" && !b.busy[key] {
		b.busy[key] = true
		b.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":"busy, nothing charged"}`, http.StatusServiceUnavailable)
		return
	}
	b.n++
	id := b.n
	b.mu.Unlock()
	time.Sleep(200 * time.Millisecond) // a slow legacy write
	var out bytes.Buffer
	_ = json.NewEncoder(&out).Encode(map[string]any{
		"id": fmt.Sprintf("ch_%04d", id), "path": r.URL.Path, "for": r.Header.Get("X-Forwarded-User"), "request": in,
	})
	b.mu.Lock()
	b.answers[r.Header.Get("X-Forwarded-User")+"\x00"+key] = out.Bytes()
	b.mu.Unlock()
	if in["simulate"] == "reset_after_charge" {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close() // charged, and the answer is lost
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(out.Bytes())
}

// demoListen is the demo sidecar's client address: addr when it is free;
// when it is taken, a free port if addr is the default, an error naming
// -listen if the command line gave it.
func demoListen(addr string, given bool) (string, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		ln.Close()
		return addr, nil
	case given:
		return "", fmt.Errorf("demo -listen %s: %w", addr, err)
	}
	return "127.0.0.1:0", nil
}

// flagGiven reports whether the command line set fs's flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// demoGRPCMethod is the bank's unary gRPC method (protocol: grpc).
const demoGRPCMethod = "/bank.v1.Orders/PlaceOrder"

// placeOrder is a charged unary gRPC call: one message back, the status
// and the charge's id in the trailers.
func (b *legacyBank) placeOrder(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	b.mu.Lock()
	b.n++
	id := b.n
	b.mu.Unlock()
	time.Sleep(200 * time.Millisecond) // a slow legacy write
	msg := fmt.Appendf(nil, "order placed, charge ch_%04d", id)
	w.Header().Set("Content-Type", "application/grpc")
	w.WriteHeader(http.StatusOK)
	w.Write(append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...))
	w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	w.Header().Set(http.TrailerPrefix+"X-Charge-Id", fmt.Sprintf("ch_%04d", id))
}

// hedged sends a gRPC call as a hedging client does: three identical
// copies 10 ms apart (to one sidecar here; to three pods in production),
// and compares what each copy got.
func (s *demoShow) hedged() error {
	client := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	defer client.CloseIdleConnections()
	msg := []byte("\x0a\x07hedge-1") // field 1: the request id
	call := append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
	type copyGot struct{ status, charge, body, replayed string }
	got := make([]copyGot, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
			req, _ := http.NewRequest(http.MethodPost, s.base+demoGRPCMethod, bytes.NewReader(call))
			req.Header.Set("Content-Type", "application/grpc")
			req.Header.Set("Te", "trailers")
			req.Header.Set("X-Forwarded-User", "alice")
			req.Header.Set("Idempotency-Key", "hedge-1")
			resp, err := client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			errs[i] = err
			got[i] = copyGot{resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("X-Charge-Id"), string(body), resp.Header.Get("Idempotent-Replayed")}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	ok, replayed := 0, 0
	for _, g := range got {
		if g.status == "0" && g.charge == got[0].charge && g.body == got[0].body {
			ok++
		}
		if g.replayed == "true" {
			replayed++
		}
	}
	s.row("3 hedged gRPC copies, 10 ms apart", fmt.Sprintf("%d x OK with the same message and trailers (charge %s), %d replayed", ok, got[0].charge, replayed))
	return nil
}
