package main

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// chaos -grpc: one operation in three is a unary gRPC call on a protocol:
// grpc route, its JSON body the request message, the ledger's JSON answer
// the response message. An answer is recorded as the HTTP route's would
// be (OK as 201, INTERNAL as 500, idemproxy's own answers by their
// problem type), so that the checker judges both alike.

// grpcPath is the gRPC method the -grpc operations call.
const grpcPath = "/chaos.v1.Payments/Pay"

// h2cProtocols are HTTP/1.1 (for a server) and HTTP/2 without TLS.
func h2cProtocols(http1 bool) *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(http1)
	p.SetUnencryptedHTTP2(true)
	return p
}

// frame is msg as one length-prefixed gRPC message; unframe its inverse
// (a body that is not one frame is kept as it is).
func frame(msg []byte) []byte {
	out := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

func unframe(body []byte) []byte {
	if len(body) >= 5 && uint64(binary.BigEndian.Uint32(body[1:5])) == uint64(len(body)-5) {
		return body[5:]
	}
	return body
}

// answerGRPC answers a call with status code and, when given, msg.
func answerGRPC(w http.ResponseWriter, code int, msg []byte) {
	w.Header().Set("Content-Type", "application/grpc")
	w.WriteHeader(http.StatusOK)
	if msg != nil {
		w.Write(frame(msg))
	}
	w.Header().Set(http.TrailerPrefix+"Grpc-Status", strconv.Itoa(code))
}

// problemStatuses are the HTTP statuses of idemproxy's own answers, by
// the problem type a gRPC answer names in idemproxy-problem.
var problemStatuses = map[string]int{
	"key-reused": 422, "record-lost": 412, "key-expired": 412, "request-in-progress": 409,
	"outcome-unknown": 502, "upstream-failed": 502, "upstream-unreachable": 502, "upstream-timeout": 504,
	"store-unavailable": 503, "store-full": 503, "overloaded": 503, "buffers-full": 503,
	"record-unreadable": 500, "response-not-replayable": 409,
}

// sendGRPC makes req (an attempt built as an HTTP one) a unary gRPC call
// and records its answer in a.
func (w *workload) sendGRPC(req *http.Request, a *attempt) {
	body, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(strings.NewReader(string(frame(body))))
	req.ContentLength = int64(len(body) + 5)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := w.h2c.Do(req)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			code := resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status")
			problem := resp.Header.Get("Idemproxy-Problem")
			a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true" || resp.Trailer.Get("Idempotent-Replayed") == "true"
			switch {
			case problem != "":
				a.Status = problemStatuses[problem]
				if a.Status == 0 {
					a.Status = 400
				}
				a.Body = "urn:idemproxy:problem:" + problem + " " + resp.Header.Get("Grpc-Message")
			case code == "0":
				a.Status, a.Body = http.StatusCreated, string(unframe(b))
			case code == "13":
				a.Status, a.Body = http.StatusInternalServerError, string(unframe(b))
			case code == "14":
				a.Status = http.StatusServiceUnavailable
			default:
				a.Status, a.Body = 599, "grpc-status "+code
			}
		}
	}
	if err != nil {
		a.Err = err.Error()
	}
	a.End = time.Now()
	w.mu.Lock()
	w.history = append(w.history, *a)
	w.mu.Unlock()
}

// hedged is a gRPC operation's first attempt as a hedging client sends
// it: identical copies to two or three sidecars, 10 ms apart, all kept.
func (w *workload) hedged(op, n int, principal, key, path, body string, firstSent time.Time) []attempt {
	copies := min(2+rand.IntN(2), len(w.sidecars))
	first := rand.IntN(len(w.sidecars))
	results := make([]attempt, copies)
	var wg sync.WaitGroup
	for i := range copies {
		sc := w.sidecars[(first+i)%len(w.sidecars)]
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
			results[i] = w.send(sc, op, n, principal, key, path, body, false, firstSent)
		})
	}
	wg.Wait()
	return results
}
