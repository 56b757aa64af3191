package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream modes, set by the fault schedule. In every mode but transient
// the ledger records an execution: the effect happened.
const (
	modeNormal int32 = iota
	modeSlow         // 0.5 to 1.5 s per request
	modeHang         // acts, then answers after the sidecar's upstream timeout
	modeReset        // acts, then drops the connection without answering
	mode503          // does nothing and answers 503
	// modeCommitLate acts only after commitAfter, past the sidecar's
	// upstream timeout (a transaction that commits late): until then a
	// lookup truthfully finds nothing.
	modeCommitLate
)

var modeNames = []string{"normal", "slow", "hang", "reset", "503", "commit-late"}

// execution is one time the upstream acted.
type execution struct {
	Principal string    `json:"principal"`
	Key       string    `json:"key"`
	RequestID string    `json:"request_id"`
	BodyHash  string    `json:"body_hash"`
	Status    int       `json:"status"`
	Response  string    `json:"response"`
	Start     time.Time `json:"start"`
	// Mode is the upstream mode the execution ran in: a hang answers
	// late, a reset never answers.
	Mode string `json:"mode"`
	// Whole: a streamed answer (chaos -stream) the upstream wrote to its
	// end (no reset broke it off).
	Whole bool `json:"whole,omitempty"`
}

// ledger is a legacy payments upstream that records every execution per
// (principal, key) and can be told to misbehave.
type ledger struct {
	mode atomic.Int32
	// hangFor is how long modeHang sleeps: beyond the sidecar's upstream
	// timeout, so the sidecar sees no answer.
	hangFor time.Duration
	// commitAfter is how long modeCommitLate waits before it acts: beyond
	// the upstream timeout plus late_answer_window (4 s), within
	// absent_after (5 s), the most a route's absent_after allows.
	commitAfter time.Duration
	// failRate is the share of normal requests answered 500 after acting,
	// and transientRate the share answered 503 without acting.
	failRate, transientRate float64

	mu    sync.Mutex // guards execs and seq
	execs []execution
	seq   int
}

func (l *ledger) executions() []execution {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]execution(nil), l.execs...)
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if key, ok := strings.CutPrefix(r.URL.Path, "/payments/by-key/"); ok && r.Method == http.MethodGet {
		l.lookup(w, r.Header.Get("X-Forwarded-User"), key)
		return
	}
	body, _ := io.ReadAll(r.Body)
	call := r.URL.Path == grpcPath
	if call {
		body = unframe(body)
	}
	mode := l.mode.Load()
	roll := rand.Float64()
	if mode == mode503 || (mode == modeNormal && roll < l.transientRate) {
		if call {
			answerGRPC(w, 14, nil) // UNAVAILABLE, nothing done
			return
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":"busy, nothing done"}`, http.StatusServiceUnavailable)
		return
	}
	if mode == modeCommitLate {
		time.Sleep(l.commitAfter)
	}
	sum := sha256.Sum256(body)
	ex := execution{
		Principal: r.Header.Get("X-Forwarded-User"),
		Key:       r.Header.Get("Idempotency-Key"),
		RequestID: r.Header.Get("X-Request-Id"),
		BodyHash:  hex.EncodeToString(sum[:8]),
		Status:    http.StatusCreated,
		Start:     time.Now(),
		Mode:      modeNames[mode],
	}
	if mode == modeNormal && roll > 1-l.failRate {
		ex.Status = http.StatusInternalServerError
	}
	l.mu.Lock()
	l.seq++
	resp, _ := json.Marshal(map[string]any{"principal": ex.Principal, "key": ex.Key, "execution": l.seq, "status": ex.Status})
	ex.Response = string(resp)
	at := len(l.execs)
	l.execs = append(l.execs, ex)
	l.mu.Unlock()

	if r.URL.Path == "/payments-stream" {
		if l.stream(w, mode, ex.Status, resp) {
			l.mu.Lock()
			l.execs[at].Whole = true
			l.mu.Unlock()
		}
		return
	}
	switch mode {
	case modeSlow:
		time.Sleep(500*time.Millisecond + rand.N(time.Second))
	case modeHang:
		time.Sleep(l.hangFor)
	case modeReset:
		if call {
			panic(http.ErrAbortHandler) // HTTP/2: the stream reset, the connection kept
		}
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
			return
		}
	default:
		time.Sleep(time.Duration(2+rand.IntN(20)) * time.Millisecond)
	}
	if call {
		answerGRPC(w, map[int]int{http.StatusCreated: 0, http.StatusInternalServerError: 13}[ex.Status], resp)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ex.Status)
	w.Write(resp)
}

// lookup is the reconcile lookup (chaos -reconcile): the ledger's latest
// execution for principal's key, with its own status and body, or 404;
// both echo the key. It reads what the executions wrote, whatever mode
// the upstream's POSTs are in: the database answers while the app
// misbehaves.
func (l *ledger) lookup(w http.ResponseWriter, principal, key string) {
	l.mu.Lock()
	var found *execution
	for i := len(l.execs) - 1; i >= 0; i-- {
		if e := &l.execs[i]; e.Principal == principal && e.Key == key {
			found = e
			break
		}
	}
	var ex execution
	if found != nil {
		ex = *found
	}
	l.mu.Unlock()
	w.Header().Set("Idempotency-Key", key)
	if found == nil {
		http.Error(w, `{"error":"no such key"}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ex.Status)
	w.Write([]byte(ex.Response))
}

// stream answers an execution as a stream (chaos -stream): its response in
// three pieces, text/event-stream without Content-Length, so that the
// pieces put together are the execution's response. A reset breaks the
// stream off after its first piece, and so does one stream in 30 in any
// mode (the fault schedule may draw no reset in a short run); a hang
// holds the headers; slow spaces the pieces. It reports whether it wrote
// the whole answer.
func (l *ledger) stream(w http.ResponseWriter, mode int32, status int, resp []byte) bool {
	pause := time.Duration(1+rand.IntN(10)) * time.Millisecond
	brk := rand.IntN(30) == 0
	switch mode {
	case modeHang:
		time.Sleep(l.hangFor)
	case modeSlow:
		pause = 200*time.Millisecond + rand.N(400*time.Millisecond)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	third := len(resp) / 3
	for i, piece := range [][]byte{resp[:third], resp[third : 2*third], resp[2*third:]} {
		if i > 0 {
			time.Sleep(pause)
		}
		w.Write(piece)
		rc.Flush()
		if mode == modeReset || brk {
			if conn, _, err := rc.Hijack(); err == nil {
				conn.Close() // the chunked body ends without its last chunk
			}
			return false
		}
	}
	return true
}
