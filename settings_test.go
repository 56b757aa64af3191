package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
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
