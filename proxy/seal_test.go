package proxy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/proxy"
)

// charge answers like a payments app that also logs the caller in: a
// confirmation worth hiding, and a session cookie for this attempt only.
func charge(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3ss10n-" + r.Header.Get("Idempotency-Key")})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"status":"succeeded","card":"4242-confirmation"}`)
}

// Issue 13, read / tamper / forge / cookies: with sealing on, Redis holds
// no plaintext of the answer, an edited record is never replayed, a record
// planted where the unkeyed hash points is never found, and Set-Cookie is
// neither stored nor replayed.
func TestSealedRecordsEndToEnd(t *testing.T) {
	key := make([]byte, claim.KeySize)
	rand.Read(key)
	opt, err := claim.WithSealing([][]byte{key}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, charge, func(c *setup) { c.StoreOptions = []claim.Option{opt} })
	ctx := context.Background()
	first := e.do(req{user: "alice", key: "k", body: `{"amount":1}`})
	if first.status != http.StatusCreated || !strings.Contains(first.header.Get("Set-Cookie"), "s3ss10n-k") {
		t.Fatalf("first attempt: %d %v; want 201 with the session cookie", first.status, first.header)
	}
	rkey := e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "k")
	raw, err := e.rdb.Get(ctx, rkey).Bytes()
	if err != nil {
		t.Fatalf("the record is not where the keyed derivation says: %v", err)
	}
	for _, plain := range []string{"4242-confirmation", "succeeded", "s3ss10n", "Set-Cookie", "application/json"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("Redis holds %q in clear text", plain)
		}
	}
	replay := e.do(req{user: "alice", key: "k", body: `{"amount":1}`})
	if replay.status != http.StatusCreated || replay.body != first.body || replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s", replay.status, replay.body)
	}
	if c := replay.header.Get("Set-Cookie"); c != "" {
		t.Errorf("the replay hands out the first attempt's cookie %q", c)
	}
	// Tamper: one byte of the sealed part changed.
	raw[len(raw)-5] ^= 0x20
	e.rdb.Set(ctx, rkey, raw, time.Hour)
	r := e.do(req{user: "alice", key: "k", body: `{"amount":1}`})
	if r.status != http.StatusInternalServerError || !strings.Contains(r.body, "record-unreadable") || strings.Contains(r.body, "4242") {
		t.Fatalf("tampered record: %d %s, want 500 record-unreadable", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Fatalf("upstream executed %d times, want 1", n)
	}
	// Forge: a completed record planted under the public, unkeyed hash of
	// the victim's next key is never found.
	public := redisstore.New(e.rdb, e.prefix)
	planted := &claim.Record{State: claim.InProgress, Created: time.Now()}
	pk := public.Codec().Key("alice", proxy.KeyScope("pay", false), "next")
	public.Claim(ctx, pk, planted, time.Minute, claim.Quota{})
	done := *planted
	done.State, done.Status, done.Body, done.Completed = claim.Completed, 201, []byte(`{"charged":true}`), time.Now()
	if _, err := public.Complete(ctx, pk, &done, time.Hour); err != nil {
		t.Fatal(err)
	}
	if r := e.do(req{user: "alice", key: "next", body: `{"amount":1}`}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the victim's first request: %d replayed=%q, want a real execution", r.status, r.header.Get("Idempotent-Replayed"))
	}
	if n := e.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2", n)
	}
	e.quiesce()
	if got := e.counter("idemproxy_record_errors_total", map[string]string{"reason": "tampered"}); got != 1 {
		t.Errorf("record_errors_total{reason=tampered} = %v, want 1", got)
	}
}
