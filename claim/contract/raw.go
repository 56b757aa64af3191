package contract

// The cases that read or plant a stored value, on how records are stored:
// a foreign value, compression, keyed fingerprints, compact records. By
// area beside them: clocks.go, sealing.go, sealedstreams.go, takeover.go.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// testForeignValue: a value that is not a record of ours (or has our
// version byte and does not decode) is never claimed over, completed over
// or released: each answers an error, and the value stays as it was.
func testForeignValue(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	foreign := "\x01\x01\x00not a record of ours at all, but with our version byte"
	for _, v := range []string{"hello", foreign, ""} {
		if err := d.Plant(ctx, key, []byte(v), time.Hour); err != nil {
			t.Fatal(err)
		}
		rec := NewRecord(t)
		if _, err := s.Claim(ctx, key, rec, time.Second, claim.Quota{}); !errors.Is(err, claim.ErrCorrupt) {
			t.Errorf("claim over %q = %v, want ErrCorrupt", v, err)
		}
		if _, err := s.Complete(ctx, key, Completed(rec, "x"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
			t.Errorf("complete over %q = %v, want ErrLeaseLost", v, err)
		}
		if err := s.Release(ctx, key, rec.Token); !errors.Is(err, claim.ErrLeaseLost) {
			t.Errorf("release over %q = %v, want ErrLeaseLost", v, err)
		}
		if got, err := d.Raw(ctx, key); err != nil || string(got) != v {
			t.Errorf("foreign value changed to %q, %v", got, err)
		}
	}
}

// testCompressedRecords (issue 35): a store that compresses writes a
// JSON answer's body zstd-compressed (smaller in Redis, flagged), and it,
// and a store that does not compress, read the same answer back byte for
// byte; a small body, or one with a Content-Encoding, is stored as it is.
func testCompressedRecords(t *testing.T, d Deployment, plain claim.Backend) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:zstd:%d:", time.Now().UnixNano())
	z := d.Open(t, prefix, claim.WithCompression())
	reader := d.Open(t, prefix)
	payment := []byte(`{"id":"pi_3MtwBwLkdIwHu7ix28a3tqPa","object":"payment_intent","amount":2000,"amount_capturable":0,"amount_received":0,"currency":"usd","status":"requires_payment_method","payment_method_types":["card"],"metadata":{"order_id":"6735"}}`)
	body := bytes.Repeat(payment, 12) // about 3 KB of JSON
	for _, tc := range []struct {
		name     string
		body     []byte
		encoding string
		shrinks  bool
	}{
		{"3 KB JSON", body, "", true},
		{"small", payment[:100], "", false},
		{"already gzip", body, "gzip", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := z.Codec().Key("p", "zstd", tc.name)
			rec := NewRecord(t)
			if _, err := z.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
				t.Fatal(err)
			}
			done := Completed(rec, string(tc.body))
			if tc.encoding != "" {
				done.Header = http.Header{"Content-Encoding": {tc.encoding}}
			}
			if _, err := z.Complete(ctx, key, done, time.Hour); err != nil {
				t.Fatal(err)
			}
			raw, err := d.Raw(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			stored, err := claim.Decode(raw)
			if err != nil {
				t.Fatal(err)
			}
			if stored.BodyCompressed != tc.shrinks || tc.shrinks && len(stored.Body) > len(tc.body)/3 {
				t.Errorf("stored body: compressed %t, %d bytes of %d; want compressed %t (to a third at most)", stored.BodyCompressed, len(stored.Body), len(tc.body), tc.shrinks)
			}
			for name, s := range map[string]claim.Backend{"the compressing store": z, "a store that does not compress": reader} {
				got, _, err := s.Get(ctx, key)
				if err == nil && got != nil {
					// Read as stored; inflated by whoever answers with it.
					if got.BodyCompressed != tc.shrinks {
						t.Errorf("%s reads the body compressed %t, want %t", name, got.BodyCompressed, tc.shrinks)
					}
					n, lerr := got.InflatedLen()
					if err = lerr; err == nil {
						err = got.Inflate(make([]byte, 0, n))
					}
				}
				if err != nil || got == nil || !bytes.Equal(got.Body, tc.body) || got.BodyCompressed {
					t.Errorf("%s reads: %v, body equal %t", name, err, got != nil && bytes.Equal(got.Body, tc.body))
				}
			}
		})
	}
}

// testKeyedFingerprints: under record_format 2 a record's fingerprint is
// stored keyed (not the request's SHA-256, which a reader of Redis could
// confirm guesses against); every store with the secret compares both
// kinds, so records written before the switch stay comparable; a store
// without the secret never takes a keyed fingerprint for a match.
func testKeyedFingerprints(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	secret := bytes.Repeat([]byte{3}, 32)
	prefix := "kf:" + s.Codec().Prefix()
	v1 := d.Open(t, prefix, claim.WithKeyedFingerprints(secret, false))
	v2 := d.Open(t, prefix, claim.WithKeyedFingerprints(secret, true))
	plain := d.Open(t, prefix)
	defer v1.Close()
	defer v2.Close()
	defer plain.Close()
	fp := claim.Fingerprint{1, 2, 3}
	other := claim.Fingerprint{9}

	old := NewRecord(t)
	old.Fingerprint = fp
	k1 := v1.Codec().Key("p", "s", "format-1")
	if res, err := v1.Claim(ctx, k1, old, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	got, _, err := v2.Get(ctx, k1)
	if err != nil || got.KeyedFingerprint || !v2.Codec().SameRequest(got, fp) || v2.Codec().SameRequest(got, other) {
		t.Fatalf("a format-1 record read under format 2: %+v %v", got, err)
	}

	rec := NewRecord(t)
	rec.Fingerprint = fp
	k2 := v2.Codec().Key("p", "s", "format-2")
	if res, err := v2.Claim(ctx, k2, rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if _, err := v2.Complete(ctx, k2, Completed(rec, "ok"), time.Minute); err != nil {
		t.Fatal(err)
	}
	raw, err := d.Raw(ctx, k2)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := claim.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.KeyedFingerprint || stored.Fingerprint == fp {
		t.Fatalf("format 2 stored the plain fingerprint: keyed=%t", stored.KeyedFingerprint)
	}
	for name, st := range map[string]claim.Backend{"format 2": v2, "format 1 with the secret": v1} {
		if !st.Codec().SameRequest(stored, fp) || st.Codec().SameRequest(stored, other) {
			t.Errorf("%s: a keyed record does not compare as the request it was written for", name)
		}
	}
	if plain.Codec().SameRequest(stored, fp) {
		t.Error("a store without the secret matched a keyed fingerprint")
	}
}

// Compact records (store.record_format: 3) on every deployment: written
// compact, read back equal by a store that does not write them (a
// replica still on format 1 of this release), fenced by the scripts as
// the fixed layout is (a resent completion is ours; another owner's is
// refused; forget by state works), and a sealing store keeps the fixed
// layout, whose header is the sealing's additional data.
func testCompactRecords(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:compact:%d:", time.Now().UnixNano())
	compact := d.Open(t, prefix, claim.WithCompactRecords())
	reader := d.Open(t, prefix)
	key := compact.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := compact.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	done := Completed(rec, `{"id":"ch_1"}`)
	done.RequestID = "0123456789abcdef0123456789abcdef"
	done.Header.Set("Date", "Tue, 01 Dec 2026 18:00:00 GMT")
	done.Header.Set("Content-Length", "13")
	if _, err := compact.Complete(ctx, key, done, time.Hour); err != nil {
		t.Fatal(err)
	}
	raw, err := d.Raw(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if stored, err := claim.Decode(raw); err != nil || !stored.Compact {
		t.Fatalf("stored: %+v, %v; want a compact record", stored, err)
	}
	got, _, err := reader.Get(ctx, key)
	if err != nil || got == nil || string(got.Body) != string(done.Body) || got.RequestID != done.RequestID ||
		got.Header.Get("Date") != done.Header.Get("Date") || got.Header.Get("Content-Length") != "13" || got.Status != 201 {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	if res, err := compact.Complete(ctx, key, done, time.Hour); err != nil || res != claim.Stored {
		t.Errorf("a resent completion over our compact record: %v, %v; want Stored", res, err)
	}
	other := *done
	other.Token[0] ^= 0xff
	if _, err := compact.Complete(ctx, key, &other, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("another owner's completion over a compact record: %v, want ErrLeaseLost", err)
	}
	if err := compact.Forget(ctx, key, claim.InProgress); !errors.Is(err, claim.ErrStateChanged) {
		t.Errorf("forget a compact completed record as in progress: %v, want ErrStateChanged", err)
	}
	if err := compact.Forget(ctx, key, claim.Completed); err != nil {
		t.Errorf("forget a compact completed record: %v", err)
	}
	if raw, _ := d.Raw(ctx, key); raw != nil {
		t.Error("the forgotten compact record is still there")
	}

	testSealedCompactRecords(t, d, prefix)
}

// testSealedCompactRecords: under sealing, record_format 3 keeps the
// fixed layout.
func testSealedCompactRecords(t *testing.T, d Deployment, prefix string) {
	ctx := context.Background()
	sealing, err := claim.WithSealing([][]byte{newKey(t)}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	sealedCompact := d.Open(t, prefix+"sealed:", sealing, claim.WithCompactRecords())
	key := sealedCompact.Codec().Key("alice", "route", "k2")
	rec := NewRecord(t)
	if _, err := sealedCompact.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sealedCompact.Complete(ctx, key, Completed(rec, `{"card":"secret"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _, err := sealedCompact.Get(ctx, key); err != nil || got == nil || string(got.Body) != `{"card":"secret"}` || got.Compact {
		t.Fatalf("a sealed record under record_format 3: %+v, %v; want it sealed in the fixed layout and read back", got, err)
	}
}
