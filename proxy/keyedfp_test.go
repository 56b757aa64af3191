package proxy_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// Switching to store.record_format 2 (keyed fingerprints, issue 24
// finding 4) in the middle of a key's life: a record written before the
// switch is still replayed, and a reused key with another body still gets
// 422; a record written after is replayed by a replica still writing
// format 1 (it holds the secret), as during the rollout of the setting.
func TestKeyedFingerprintsAcrossTheSwitch(t *testing.T) {
	srv := redistest.Start(t)
	secret := bytes.Repeat([]byte{5}, 32)
	before := newEnvOn(t, srv, created, func(c *setup) {
		c.StoreOptions = []claim.Option{claim.WithKeySecret(secret), claim.WithKeyedFingerprints(secret, false)}
	})
	after := newEnvOn(t, srv, created, func(c *setup) {
		c.StoreOptions = []claim.Option{claim.WithKeySecret(secret), claim.WithKeyedFingerprints(secret, true)}
	})
	if r := before.do(req{user: "alice", key: "old", body: `{"amount":1}`}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	if r := after.do(req{user: "alice", key: "old", body: `{"amount":1}`}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a format-1 record after the switch: %d, want the replay", r.status)
	}
	if r := after.do(req{user: "alice", key: "old", body: `{"amount":2}`}); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("a format-1 record reused with another body after the switch: %d, want 422", r.status)
	}
	if r := after.do(req{user: "alice", key: "new", body: `{"amount":3}`}); r.status != http.StatusCreated {
		t.Fatal(r.status)
	}
	if r := before.do(req{user: "alice", key: "new", body: `{"amount":3}`}); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a keyed record on a replica writing format 1: %d, want the replay", r.status)
	}
	if r := before.do(req{user: "alice", key: "new", body: `{"amount":4}`}); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("a keyed record reused with another body: %d, want 422", r.status)
	}
	if n := before.ledger.Total() + after.ledger.Total(); n != 2 {
		t.Fatalf("upstream executed %d times, want 2", n)
	}
}
