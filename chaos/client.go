package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// attempt is one HTTP request a client made for a logical operation.
type attempt struct {
	Op        int    `json:"op"`
	N         int    `json:"n"`
	Sidecar   int    `json:"sidecar"`
	Version   string `json:"version"` // the sidecar's: "current" or the previous release
	Principal string `json:"principal"`
	Key       string `json:"key"`
	Path      string `json:"path"`
	BodyHash  string `json:"body_hash"`
	Changed   bool   `json:"changed"` // a deliberately different body for the same key
	// FirstSent is set when the attempt said when its operation was
	// first sent (Repeatability-First-Sent).
	FirstSent bool      `json:"first_sent"`
	RequestID string    `json:"request_id"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Status    int       `json:"status"` // 0: transport error or client gave up
	Replayed  bool      `json:"replayed"`
	// Reconciled: the answer came from a reconcile lookup (-reconcile).
	Reconciled bool   `json:"reconciled,omitempty"`
	Body       string `json:"body"`
	Err        string `json:"err,omitempty"`
	// Broken: a streamed answer that ended abnormally (Body is what came
	// before the end), as every retry of it will.
	Broken bool `json:"broken,omitempty"`
	// Reader is how this attempt read a streamed answer (readerSlow,
	// readerStalled; empty: at once), and Follower marks an attempt sent
	// while the operation's first was streaming (followed).
	Reader   string `json:"reader,omitempty"`
	Follower bool   `json:"follower,omitempty"`
}

// How a client reads a streamed answer (chaos -stream): most at once; one
// in six slowly, one in six stalled. The stream must be stored at the
// upstream's pace and whole whatever they do.
const (
	readerSlow    = "slow"    // 16 bytes every 20-60 ms
	readerStalled = "stalled" // nothing for 0.3-1.5 s after the headers, then all
)

// readAnswer reads resp's body as a client reading the way reader says.
func readAnswer(body io.Reader, reader string) ([]byte, error) {
	switch reader {
	case readerStalled:
		time.Sleep(300*time.Millisecond + rand.N(1200*time.Millisecond))
	case readerSlow:
		var out []byte
		buf := make([]byte, 16)
		for {
			n, err := body.Read(buf)
			out = append(out, buf[:n]...)
			if err == io.EOF {
				return out, nil
			}
			if err != nil {
				return out, err
			}
			time.Sleep(20*time.Millisecond + rand.N(40*time.Millisecond))
		}
	}
	return io.ReadAll(body)
}

// settled reports whether a client would stop retrying on this answer:
// the outcome, or (unknown_outcome: fail) word that it is unknown, unless
// that word says to retry with the same key (a reconcile route: a retry
// asks the upstream again).
func settled(a attempt) bool {
	if a.Broken {
		// A stream that broke off is retried once it is seen live: the
		// retry must get the same prefix and the same end (replayed).
		return a.Replayed
	}
	return a.Status == http.StatusCreated || a.Status == http.StatusInternalServerError ||
		a.Status == http.StatusUnprocessableEntity ||
		outcomeUnknown(a) && !strings.Contains(a.Body, "Retry with the same idempotency key") ||
		a.Status == http.StatusPreconditionFailed // key-expired, record-lost: reconcile, new key
}

// outcomeUnknown reports a 502 outcome-unknown: the key is settled, and
// the client must check the resource and use a new key.
func outcomeUnknown(a attempt) bool {
	return a.Status == http.StatusBadGateway && strings.Contains(a.Body, "problem:outcome-unknown")
}

// workload runs logical operations against the sidecars: each is one
// payment, retried until it gets a settled answer.
type workload struct {
	sidecars   []*sidecar
	principals int
	maxOps     int
	deadline   time.Time
	client     *http.Client
	// pace hands out one token per operation, spreading the operations
	// over the run so that faults hit them.
	pace <-chan time.Time
	// stream sends one operation in four to /payments-stream.
	stream bool
	// grpc sends one operation in three as a gRPC call (grpc.go), over
	// h2c.
	grpc bool
	h2c  *http.Client

	next    atomic.Int64
	reqSeq  atomic.Int64
	mu      sync.Mutex // guards history and gaveUp
	history []attempt
	gaveUp  int
}

func (w *workload) run(workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(w.deadline) {
				<-w.pace
				op := int(w.next.Add(1))
				if op > w.maxOps {
					return
				}
				w.operation(op)
			}
		})
	}
	wg.Wait()
}

// operation is one payment: a key, a body, and retries with jittered
// timeouts and backoff until a settled answer. Some start with two
// concurrent attempts; some end with a retry carrying a changed body.
func (w *workload) operation(op int) {
	principal := fmt.Sprintf("user-%d", rand.IntN(w.principals))
	key := fmt.Sprintf("op-%d-%x", op, rand.Uint32())
	path := "/payments"
	switch {
	case w.grpc && rand.IntN(3) == 0:
		path = grpcPath
	case w.stream && rand.IntN(4) == 0:
		path = "/payments-stream"
	case rand.IntN(4) == 0:
		path = "/payments-wait"
	}
	body := fmt.Sprintf(`{"amount":%d,"currency":"EUR"}`, 100+rand.IntN(10000))
	// Three operations in four say when they were first sent: their
	// retries must never execute again, even after Redis lost its data.
	var firstSent time.Time
	if rand.IntN(4) != 0 {
		firstSent = time.Now()
	}
	opDeadline := time.Now().Add(20 * time.Second)
	backoff := 50 * time.Millisecond
	for n := 0; n < 14 && time.Now().Before(opDeadline); n++ {
		parallel := 1
		if n == 0 && rand.IntN(5) == 0 {
			parallel = 2 + rand.IntN(2)
		}
		var results []attempt
		switch {
		case path == grpcPath && n == 0:
			results = w.hedged(op, n, principal, key, path, body, firstSent)
		case path == "/payments-stream" && n == 0 && rand.IntN(3) == 0:
			results = w.followed(op, n, principal, key, path, body, firstSent)
		case parallel == 1 && rand.IntN(4) == 0:
			results = w.impatient(op, n, principal, key, path, body, firstSent)
		default:
			results = make([]attempt, parallel)
			var wg sync.WaitGroup
			for i := range parallel {
				wg.Go(func() { results[i] = w.send(w.pick(), op, n, principal, key, path, body, false, firstSent) })
			}
			wg.Wait()
		}
		done := false
		wait := backoff
		for _, a := range results {
			done = done || settled(a)
			if a.Status == http.StatusConflict {
				wait = max(wait, 300*time.Millisecond)
			}
		}
		if done {
			if rand.IntN(30) == 0 {
				changed := fmt.Sprintf(`{"amount":%d,"currency":"EUR"}`, 20000+rand.IntN(100))
				w.send(w.pick(), op, n+1, principal, key, path, changed, true, firstSent)
			}
			return
		}
		time.Sleep(wait/2 + rand.N(wait))
		backoff = min(backoff*2, time.Second)
	}
	w.mu.Lock()
	w.gaveUp++
	w.mu.Unlock()
}

// followed is a streamed operation's first attempt with a retry sent 20
// to 150 ms after it to another sidecar, while the first streams: an
// attached follower.
func (w *workload) followed(op, n int, principal, key, path, body string, firstSent time.Time) []attempt {
	first := w.pick()
	done := make(chan attempt, 1)
	go func() { done <- w.send(first, op, n, principal, key, path, body, false, firstSent) }()
	time.Sleep(20*time.Millisecond + rand.N(130*time.Millisecond))
	other := w.sidecars[(first.id+1+rand.IntN(len(w.sidecars)-1))%len(w.sidecars)]
	follower := w.send(other, op, n, principal, key, path, body, false, firstSent, func(a *attempt) { a.Follower = true })
	return []attempt{<-done, follower}
}

// pick is a sidecar at random.
func (w *workload) pick() *sidecar { return w.sidecars[rand.IntN(len(w.sidecars))] }

// impatient is a client that sends its request to one sidecar and, when
// no answer has come within about a second, sends the same request to
// another while the first is still waiting: both attempts are kept.
func (w *workload) impatient(op, n int, principal, key, path, body string, firstSent time.Time) []attempt {
	first := w.pick()
	done := make(chan attempt, 1)
	go func() { done <- w.send(first, op, n, principal, key, path, body, false, firstSent) }()
	select {
	case a := <-done:
		return []attempt{a}
	case <-time.After(800*time.Millisecond + rand.N(400*time.Millisecond)):
	}
	other := w.sidecars[(first.id+1+rand.IntN(len(w.sidecars)-1))%len(w.sidecars)]
	second := w.send(other, op, n, principal, key, path, body, false, firstSent)
	return []attempt{<-done, second}
}

// send is one attempt; marks, when given, mark it (as a follower).
func (w *workload) send(sc *sidecar, op, n int, principal, key, path, body string, changed bool, firstSent time.Time, marks ...func(*attempt)) attempt {
	a := attempt{
		Op: op, N: n, Sidecar: sc.id, Version: sc.version, Principal: principal, Key: key, Path: path,
		BodyHash: hashBody(body), Changed: changed,
		RequestID: "rq-" + strconv.FormatInt(w.reqSeq.Add(1), 10), Start: time.Now(),
	}
	for _, mark := range marks {
		mark(&a)
	}
	// Jittered client timeouts; a few give up almost at once, which
	// disconnects mid-request.
	timeout := 300*time.Millisecond + rand.N(2500*time.Millisecond)
	if rand.IntN(20) == 0 {
		timeout = time.Duration(5+rand.IntN(50)) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sc.url()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-User", principal)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Request-Id", a.RequestID)
	if !firstSent.IsZero() {
		req.Header.Set("Repeatability-First-Sent", firstSent.UTC().Format(http.TimeFormat))
		a.FirstSent = true
	}
	if path == "/payments-stream" {
		switch rand.IntN(6) {
		case 0:
			a.Reader = readerSlow
		case 1:
			a.Reader = readerStalled
		}
	}
	if path == grpcPath {
		w.sendGRPC(req, &a)
		return a
	}
	resp, err := w.client.Do(req)
	if err == nil {
		b, rerr := readAnswer(resp.Body, a.Reader)
		resp.Body.Close()
		switch {
		case rerr != nil && ctx.Err() == nil && resp.Header.Get("Content-Type") == "text/event-stream":
			// The stream ended abnormally (not this client giving up).
			a.Status, a.Broken, a.Body, a.Err = resp.StatusCode, true, string(b), rerr.Error()
			a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		case rerr != nil:
			err = rerr
		default:
			a.Status = resp.StatusCode
			a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
			a.Reconciled = resp.Header.Get("Idempotent-Reconciled") == "true"
			a.Body = string(b)
		}
	}
	if err != nil {
		a.Err = err.Error()
	}
	a.End = time.Now()
	w.mu.Lock()
	w.history = append(w.history, a)
	w.mu.Unlock()
	return a
}
