package contract

// The cases on sealed records and the key secret: nothing of a sealed
// record in the clear, keys that rotate, encryption required, and keys
// nobody locates without the secret.

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// A sealed record holds no plaintext of the response, opens only under its
// own Redis key, and refuses edits.
func testSealedRecords(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	prefix := "seal:" + t.Name() + ":"
	s := sealed(t, d, prefix, false, newKey(t))
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	done := Completed(rec, `{"card":"4242-secret-body"}`)
	if _, err := s.Complete(ctx, key, done, time.Hour); err != nil {
		t.Fatal(err)
	}
	raw, err := d.Raw(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{"4242-secret-body", "application/json", "X-Charge", "req-1"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("the raw value holds %q in clear text", plain)
		}
	}
	got, _, err := s.Get(ctx, key)
	if err != nil || got == nil || string(got.Body) != string(done.Body) || got.Status != 201 || got.RequestID != "req-1" {
		t.Fatalf("Get of a sealed record = %+v, %v", got, err)
	}
	// Tampered: one byte of the ciphertext flipped.
	bad := bytes.Clone(raw)
	bad[len(bad)-20] ^= 1
	d.Plant(ctx, key, bad, time.Hour)
	if _, _, err := s.Get(ctx, key); !errors.Is(err, claim.ErrCorrupt) || !strings.Contains(err.Error(), claim.ReasonTampered) {
		t.Errorf("tampered record: %v, want a tampered ErrCorrupt", err)
	}
	// Moved: the intact value under another key does not open.
	other := s.Codec().Key("alice", "route", "k2")
	d.Plant(ctx, other, raw, time.Hour)
	if _, _, err := s.Get(ctx, other); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("record moved to another key: %v, want ErrCorrupt", err)
	}
	// The scripts still fence on the readable header.
	d.Plant(ctx, key, raw, time.Hour)
	if _, err := s.Complete(ctx, key, done, time.Hour); err != nil {
		t.Errorf("resent completion over a sealed record: %v", err)
	}
}

// Keys rotate: records sealed with k1 open once k2 is added in front;
// once k1 is dropped they are unreadable, never re-executed (ErrCorrupt,
// not "absent").
func testKeyRotation(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	prefix := "rot:" + t.Name() + ":"
	k1, k2 := newKey(t), newKey(t)
	secret := newKey(t)
	with := func(keys ...[]byte) claim.Backend {
		opt, err := claim.WithSealing(keys, false, secret)
		if err != nil {
			t.Fatal(err)
		}
		return d.Open(t, prefix, opt)
	}
	s1 := with(k1)
	key := s1.Codec().Key("alice", "route", "k")
	rec := NewRecord(t)
	s1.Claim(ctx, key, rec, time.Minute, claim.Quota{})
	if _, err := s1.Complete(ctx, key, Completed(rec, "old"), time.Hour); err != nil {
		t.Fatal(err)
	}
	s12 := with(k2, k1)
	if s12.Codec().Key("alice", "route", "k") != key {
		t.Fatal("with a key_secret_file, rotation must not move keys")
	}
	if got, _, err := s12.Get(ctx, key); err != nil || string(got.Body) != "old" {
		t.Fatalf("k1 record after adding k2: %+v, %v", got, err)
	}
	s2 := with(k2)
	if _, _, err := s2.Get(ctx, key); !errors.Is(err, claim.ErrCorrupt) || !strings.Contains(err.Error(), claim.ReasonUnknownKey) {
		t.Fatalf("k1 record after dropping k1: %v, want unknown_key", err)
	}
	res, err := s2.Claim(ctx, key, NewRecord(t), time.Minute, claim.Quota{})
	if res.Claimed || !errors.Is(err, claim.ErrCorrupt) {
		t.Fatalf("claim over the unreadable record: %+v, %v; want ErrCorrupt, not a claim", res, err)
	}
}

// Without the secret, nobody computes where a key lives: a record planted
// under the unkeyed hash is never found.
func testSecretKeyDerivation(t *testing.T, d Deployment, plain claim.Backend) {
	s := sealed(t, d, "test:"+t.Name()+":", false, newKey(t))
	forged := d.Open(t, "test:"+t.Name()+":")
	if s.Codec().Key("alice", "route", "k") == forged.Codec().Key("alice", "route", "k") {
		t.Fatal("the keyed derivation equals the public one")
	}
	ctx := context.Background()
	rec := NewRecord(t)
	fk := forged.Codec().Key("alice", "route", "k")
	forged.Claim(ctx, fk, rec, time.Minute, claim.Quota{})
	forged.Complete(ctx, fk, Completed(rec, "planted"), time.Hour)
	res, err := s.Claim(ctx, s.Codec().Key("alice", "route", "k"), NewRecord(t), time.Minute, claim.Quota{})
	if err != nil || !res.Claimed {
		t.Fatalf("the victim's first claim = %+v, %v; want claimed, the planted record unseen", res, err)
	}
}

// With encryption required, a record written before it was enabled is
// unreadable rather than trusted.
func testSealingRequired(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	prefix := "req:" + t.Name() + ":"
	k, secret := newKey(t), newKey(t)
	opt, _ := claim.WithSealing([][]byte{k}, false, secret)
	optional := d.Open(t, prefix, opt)
	key := optional.Codec().Key("alice", "route", "k")
	d.Plant(ctx, key, Completed(NewRecord(t), "plain").Encode(), time.Hour)
	if got, _, err := optional.Get(ctx, key); err != nil || string(got.Body) != "plain" {
		t.Fatalf("unsealed record, encryption optional: %+v, %v", got, err)
	}
	opt, _ = claim.WithSealing([][]byte{k}, true, secret)
	required := d.Open(t, prefix, opt)
	if _, _, err := required.Get(ctx, key); !errors.Is(err, claim.ErrCorrupt) || !strings.Contains(err.Error(), claim.ReasonUnsealed) {
		t.Fatalf("unsealed record, encryption required: %v, want unsealed", err)
	}
}

func sealed(t *testing.T, d Deployment, prefix string, required bool, keys ...[]byte) claim.Backend {
	t.Helper()
	opt, err := claim.WithSealing(keys, required, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d.Open(t, prefix, opt)
}

func newKey(t *testing.T) []byte {
	k := make([]byte, claim.KeySize)
	rand.Read(k)
	return k
}
