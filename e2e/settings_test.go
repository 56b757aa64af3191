package e2e

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// postAs posts {} as principal with key: status and body.
func postAs(t *testing.T, url, principal, key string) (int, string) {
	t.Helper()
	resp, body := postAnswerAs(t, url, principal, key, `{}`)
	return resp.StatusCode, body
}

// TestPrincipalShareThroughTheBinary: the running binary obeys
// defaults.max_in_flight_principal_share. With max_in_flight 4 and a 50%
// share, alice's third concurrent first attempt is refused 503 overloaded
// (nothing forwarded, the key free), while bob still gets a slot.
func TestPrincipalShareThroughTheBinary(t *testing.T) {
	srv := redistest.Start(t)
	release := make(chan struct{})
	up := binarytest.NewRecorder(t)
	up.Handler = func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusCreated)
	}
	sc := startBinary(t, payConfig(up.URL, srv.Addr, "defaults:\n  max_in_flight: 4\n  max_in_flight_principal_share: 50%\n"))
	var wg sync.WaitGroup
	defer func() { close(release); wg.Wait() }()
	for _, k := range []string{"a1", "a2"} {
		wg.Go(func() { postAs(t, sc.Client+"/payments", "alice", k) })
	}
	poll.Until(t, "alice's two calls reach the upstream", func() bool { return up.Total() == 2 })
	if status, body := postAs(t, sc.Client+"/payments", "alice", "a3"); status != http.StatusServiceUnavailable || !strings.Contains(body, "overloaded") || !strings.Contains(body, "share") {
		t.Errorf("alice's third call: %d %s, want 503 overloaded naming her share", status, body)
	}
	if up.Executions("a3") != 0 {
		t.Error("the refused call reached the upstream")
	}
	wg.Go(func() { postAs(t, sc.Client+"/payments", "bob", "b1") })
	poll.Until(t, "bob's call reaches the upstream", func() bool { return up.Executions("b1") == 1 })
}

// uuidv7 is a UUIDv7 whose timestamp is at.
func uuidv7(at time.Time) string {
	var u [16]byte
	rand.Read(u[:])
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(u[:6], ms[2:])
	u[6] = u[6]&0x0f | 0x70
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// TestUUIDv7FirstSentThroughTheBinary: with defaults.first_sent: [uuidv7]
// the running binary reads a UUIDv7 key's time: a key older than the
// retention with no record is 412 key-expired, nothing forwarded; a fresh
// one executes.
func TestUUIDv7FirstSentThroughTheBinary(t *testing.T) {
	srv := redistest.Start(t)
	up := binarytest.NewRecorder(t)
	sc := startBinary(t, payConfig(up.URL, srv.Addr, "defaults:\n  retention: 1h\n  first_sent: [uuidv7]\n"))
	old := uuidv7(time.Now().Add(-2 * time.Hour))
	if status, body := postAs(t, sc.Client+"/payments", "alice", old); status != http.StatusPreconditionFailed || !strings.Contains(body, "key-expired") {
		t.Errorf("a UUIDv7 key from 2 h ago: %d %s, want 412 key-expired", status, body)
	}
	if up.Total() != 0 {
		t.Fatal("the expired key's request reached the upstream")
	}
	fresh := uuidv7(time.Now())
	if status, body := postAs(t, sc.Client+"/payments", "alice", fresh); status != http.StatusCreated {
		t.Errorf("a fresh UUIDv7 key: %d %s, want 201", status, body)
	}
}

// TestLateCallReserveThroughTheBinary (issue 40, item 3): with
// upstream.max_late_calls 8 and a 25% share, principals that already hold
// a late call leave the last half of the pool to principals that hold
// none. Five principals each park two slow calls past upstream.timeout
// (the second of the third, fourth and fifth is refused: cancelled at the
// timeout), then a sixth principal's slow call still gets a slot: it goes
// on, and its late answer is stored and replayed. With only the last share
// kept (v0.5.0) the sixth was cancelled and settled as outcome-unknown.
func TestLateCallReserveThroughTheBinary(t *testing.T) {
	srv := redistest.Start(t)
	release := make(chan struct{})
	up := binarytest.NewRecorder(t)
	up.Handler = func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"late":%q}`, r.Header.Get("Idempotency-Key"))
		case <-r.Context().Done():
		}
	}
	sc := startBinary(t, fmt.Sprintf(`upstream:
  url: %q
  timeout: 300ms
  max_late_calls: 8
  late_calls_principal_share: 25%%
store:
  redis:
    addrs: [%q]
routes:
  - name: pay
    match: "POST /payments"
`, up.URL, srv.Addr))
	var wg sync.WaitGroup
	released := false
	defer func() {
		if !released {
			close(release)
		}
		wg.Wait()
	}()
	// slow sends principal's slow calls at once and counts its answers:
	// 504 at upstream.timeout for a call that goes on as a late call, 502
	// outcome-unknown for one refused a late-call slot (cancelled).
	slow := func(principal string, keys ...string) (late, cancelled int) {
		t.Helper()
		statuses := make([]int, len(keys))
		var pwg sync.WaitGroup
		for i, k := range keys {
			pwg.Go(func() { statuses[i], _ = postAs(t, sc.Client+"/payments", principal, k) })
		}
		pwg.Wait()
		for i, st := range statuses {
			switch st {
			case http.StatusGatewayTimeout:
				late++
			case http.StatusBadGateway:
				cancelled++
			default:
				t.Fatalf("%s's slow call %s: %d, want 504 (a late call) or 502 (cancelled)", principal, keys[i], st)
			}
		}
		return late, cancelled
	}
	want := map[string][2]int{"p1": {2, 0}, "p2": {2, 0}, "p3": {1, 1}, "p4": {1, 1}, "p5": {1, 1}}
	for i := 1; i <= 5; i++ {
		p := fmt.Sprintf("p%d", i)
		if late, cancelled := slow(p, p+"-a", p+"-b"); [2]int{late, cancelled} != want[p] {
			t.Errorf("%s's two slow calls: %d late, %d cancelled; want %v", p, late, cancelled, want[p])
		}
	}
	if late, _ := slow("p6", "p6-a"); late != 1 {
		t.Errorf("the sixth principal's slow call was cancelled: the pool kept no slot for a principal holding none")
	}
	close(release)
	released = true
	var body string
	poll.Until(t, "the sixth principal's late answer is stored", func() bool {
		var status int
		status, body = postAs(t, sc.Client+"/payments", "p6", "p6-a")
		return status != http.StatusConflict
	})
	if !strings.Contains(body, `"late":"p6-a"`) {
		t.Errorf("the sixth principal's retry: %s, want its late answer (its call kept a late-call slot)", body)
	}
	if !metric(t, sc.Admin, `idemproxy_late_calls_refused_total{reason="reserved",route="pay"} 3`) {
		t.Errorf("want 3 late calls refused for the reserve (the second of p3, p4, p5):\n%s", grepLines(scrape(t, sc.Admin), "late_calls"))
	}
}

// grepLines is the lines of text containing s.
func grepLines(text, s string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
