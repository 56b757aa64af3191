package contract

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// waitClaimed claims key for rec, retrying until an earlier lease lapses.
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

// testUnforwardedReadersClock (issue 30): whether a claim was forwarded
// is decided on Redis' clock, never on the reader's. A reader whose reply
// arrives 2s late (its clock reads 2s on) still sees a claim that landed
// at once as forwarded; a claim that landed 3s after it was sent is seen
// as never forwarded by a reader whose clock is 2s behind. Before the fix
// the first read took time.Now() after the reply and freed the claim.
func testUnforwardedReadersClock(t *testing.T, d Deployment, owner claim.Backend) {
	ctx := context.Background()
	lease := 10 * time.Second
	owner.Health(ctx)
	for _, tc := range []struct {
		name   string
		late   time.Duration // how long after Created the claim's SET runs
		reader time.Duration // the reader's clock against the true time
		want   bool
	}{
		{"on time, the reply 2s late", 0, 2 * time.Second, false},
		{"on time, the reply 10s late", 0, 10 * time.Second, false},
		{"ran 3s late, the reader 2s behind", 3 * time.Second, -2 * time.Second, true},
		{"ran 1.2s late, within the window and the offset", 1200 * time.Millisecond, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := owner.Codec().Key("p", "clock", tc.name)
			rec := NewRecord(t)
			rec.Created = time.Now().Add(-tc.late)
			// Planted: an owner that got this reply would have renewed a
			// claim that ran 3s late (Forwardable) before forwarding it.
			if err := planter(t, owner).PlantUnconfirmed(ctx, key, rec, lease); err != nil {
				t.Fatalf("claim: %v", err)
			}
			reader := d.Open(t, "", claim.WithPipeline(false), claim.WithClock(func() time.Time { return time.Now().Add(tc.reader) }))
			other := NewRecord(t)
			other.Created = time.Now()
			res, err := reader.Claim(ctx, key, other, lease, claim.Quota{})
			if err != nil || res.Claimed || res.Unforwarded != tc.want {
				t.Fatalf("read: %+v %v, want Unforwarded %t", res, err, tc.want)
			}
		})
	}
}

// testUnmarkedWhileClockOff: an owner whose clock is 2s from Redis' writes
// its claims unmarked, so that no reader can ever free them early (their
// SET time cannot be compared with a Created time read on that clock);
// once its clock is back, its claims are marked again.
func testUnmarkedWhileClockOff(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	var off atomic.Int64
	off.Store(int64(2 * time.Second))
	s := d.Open(t, "test:clockoff:", claim.WithClock(func() time.Time { return time.Now().Add(time.Duration(off.Load())) }))
	s.Health(ctx)
	rec := NewRecord(t)
	rec.Created = time.Now()
	key := s.Codec().Key("p", "s", "off")
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkNone {
		t.Fatalf("a claim made 2s off Redis' clock: %+v, want MarkNone", got)
	}
	off.Store(0)
	// A measurement the first claim started in the background (its clock
	// was not known good) may still be under way with the old offset and
	// land after this one: look again until a claim is marked.
	n := 0
	poll.Until(t, "a claim made once the clock is back is marked", func() bool {
		s.Health(ctx)
		n++
		key := s.Codec().Key("p", "s", fmt.Sprint("on-", n))
		on := NewRecord(t)
		on.Created = time.Now()
		if _, err := s.Claim(ctx, key, on, 10*time.Second, claim.Quota{}); err != nil {
			t.Fatal(err)
		}
		got, _, _ := s.Get(ctx, key)
		return got != nil && got.Mark == claim.MarkClaimed
	})
}

// testOwnRoundTripDecides (issue 40): whether a claim may be forwarded
// is decided from what its own round trip read, never from the last clock
// measurement. The store measured its clock close to Redis' (the watcher),
// then a claim's SET runs, on Redis' clock, 3s after its Created time (as
// after a forward step of Redis' clock): Claim renews it before returning
// it (Renewed, MarkRenewed), so a reader never takes it for never
// forwarded, and the claims after it are unmarked until the clocks are
// measured again. A claim on time is returned as it is. Before the fix the
// late claim came back marked and a reader freed it (Unforwarded).
func testOwnRoundTripDecides(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	s := d.Open(t, fmt.Sprintf("test:own:%d:", time.Now().UnixNano()))
	s.Health(ctx)
	lease := 10 * time.Second
	onTime := NewRecord(t)
	onTime.Created = time.Now()
	key := s.Codec().Key("p", "s", "on time")
	if res, err := s.Claim(ctx, key, onTime, lease, claim.Quota{}); err != nil || !res.Claimed || res.Renewed {
		t.Fatalf("a claim on time: %+v %v, want claimed as it is", res, err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkClaimed {
		t.Fatalf("a claim on time: %+v, want MarkClaimed", got)
	}

	late := NewRecord(t)
	late.Created = time.Now().Add(-3 * time.Second)
	key = s.Codec().Key("p", "s", "late")
	res, err := s.Claim(ctx, key, late, lease, claim.Quota{Key: s.Codec().QuotaKey("p", "s"), Limit: 10, Window: time.Minute})
	if err != nil || !res.Claimed || !res.Renewed || late.Mark != claim.MarkRenewed {
		t.Fatalf("a claim whose SET ran 3s after Created: %+v %v (mark %d), want claimed and renewed", res, err, late.Mark)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkRenewed {
		t.Fatalf("its record: %+v, want MarkRenewed", got)
	}
	next := NewRecord(t)
	next.Created = time.Now()
	nextKey := s.Codec().Key("p", "s", "next")
	if _, err := s.Claim(ctx, nextKey, next, lease, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, nextKey); got == nil || got.Mark != claim.MarkNone {
		t.Fatalf("the claim after: %+v, want MarkNone until the clocks are measured again", got)

	}
	other := NewRecord(t)
	other.Created = time.Now()
	if res, err := s.Claim(ctx, key, other, lease, claim.Quota{}); err != nil || res.Claimed || res.Unforwarded {
		t.Fatalf("a retry: %+v %v, want the claim in progress, not Unforwarded", res, err)
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

// Taking a claim from its owner (TakeOver, SettleOrphan) is fenced on the
// key's expiry as the caller read it (issue 53): a renewal since moves
// it, so an owner judged gone on a reading older than its last renewal
// keeps its claim, whatever Redis' clock did. A streamed record is never
// taken over, whatever it carries; FreeAbsent refuses while Redis' clock
// and the caller's disagree by more than the rules allow.
func testTakeOverFencedOnExpiry(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "expiry")
	owner := NewRecord(t)
	owner.Tail = time.Hour
	if res, err := s.Claim(ctx, key, owner, 200*time.Millisecond, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	orphaned := func() *claim.Record {
		t.Helper()
		var got *claim.Record
		poll.Until(t, "the owner's lease runs out", func() bool {
			rec, left, err := s.Get(ctx, key)
			got = rec
			return err == nil && rec != nil && rec.Orphaned(left)
		})
		if got.Expires.IsZero() || got.ReadAt.IsZero() {
			t.Fatalf("an in-progress record read without its expiry: %+v", got)
		}
		return got
	}
	stale := orphaned()
	if err := s.Renew(ctx, key, owner, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	orphaned() // orphaned again, under a later expiry
	taker := NewRecord(t)
	if _, err := s.TakeOver(ctx, key, stale, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over on an expiry read before the owner's renewal = %v, want ErrLeaseLost", err)
	}
	settler := NewRecord(t)
	if err := s.SettleOrphan(ctx, key, stale, Completed(settler, "outcome unknown"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling on an expiry read before the owner's renewal = %v, want ErrLeaseLost", err)
	}
	fresh := orphaned()
	if _, err := s.TakeOver(ctx, key, fresh, taker, time.Minute, time.Time{}); err != nil {
		t.Fatalf("taking over on the current expiry: %v", err)
	}

	// FreeAbsent from a process whose clock is a second ahead of Redis'
	// (a store of its own, its clock set before it runs anything).
	skewed := d.Open(t, "skewed:", claim.WithClock(func() time.Time { return time.Now().Add(time.Second) }))
	defer skewed.Close()
	var early *claim.TooEarlyError
	if err := skewed.FreeAbsent(ctx, key, taker.Token, time.Now().Add(-time.Hour), 0); !errors.As(err, &early) || early.Skew == 0 {
		t.Fatalf("freeing with the clocks a second apart = %v, want ErrTooEarly for the clocks", err)
	}
	if err := s.FreeAbsent(ctx, key, taker.Token, time.Now().Add(-time.Hour), 0); err != nil {
		t.Fatalf("freeing with the clocks together: %v", err)
	}

	testTakeOverSpareStreams(t, s)
}

// testTakeOverSpareStreams: a running stream is never taken over nor
// settled as an orphan, whatever headers its head carries.
func testTakeOverSpareStreams(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "streamed")
	streamer := NewRecord(t)
	if res, err := s.Claim(ctx, key, streamer, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *streamer
	head.State, head.Status = claim.Streamed, 502
	head.Header = http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-store"}, "Idempotent-Unknown-Since": {"1"}}
	if _, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TakeOver(ctx, key, &head, NewRecord(t), time.Minute, time.UnixMilli(1)); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over a streamed record = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, &head, Completed(NewRecord(t), "outcome unknown"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a streamed record = %v, want ErrLeaseLost", err)
	}
}

// On a sealing store a streamed record seals its head and each chunk as
// it is stored: the raw value holds none of the answer, readers get every
// chunk opened as it lands (one longer than a read's bound whole), and a
// value moved to another key, a frame edited, dropped or moved, or an end
// byte set by hand over a stream that broke off does not open.
func testSealedStreams(t *testing.T, d Deployment, _ claim.Backend) {
	s := sealed(t, d, "sealstream:"+t.Name()+":", false, newKey(t))
	key, at, n1 := testSealedStreamWhole(t, d, s)
	testSealedStreamTampered(t, d, s, key, at, n1)
	testSealedStreamTruncated(t, d, s)
	testSealedStreamWithoutKeys(t, d, key, at)
}

// startSealedStream claims k on s and starts its stream, whose head
// carries a header to find in clear text: its key, head and length.
func startSealedStream(t *testing.T, s claim.Backend, k string) (string, claim.Record, int) {
	t.Helper()
	ctx := context.Background()
	key := s.Codec().Key("alice", "chat", k)
	owner := NewRecord(t)
	if res, err := s.Claim(ctx, key, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *owner
	head.State, head.Status = claim.Streamed, 200
	head.Header = http.Header{"Content-Type": {"text/event-stream"}, "X-Secret-Header": {"hdr-4242"}}
	at, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return key, head, at
}

// testSealedStreamWhole: a sealed stream's chunks are appended (resent:
// a no-op), read in frames whatever the bound, hold nothing in clear
// text, and end. Its key, where its chunks begin and where the first ends.
func testSealedStreamWhole(t *testing.T, d Deployment, s claim.Backend) (key string, at, n1 int) {
	ctx := context.Background()
	key, head, at := startSealedStream(t, s, "k1")
	big := "data: " + strings.Repeat("x", 3000) + "\n\n"
	n1, err := s.StreamAppend(ctx, key, head.Token, at, []byte("data: secret-1\n\n"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.StreamAppend(ctx, key, head.Token, at, []byte("data: secret-1\n\n"), time.Minute); err != nil || again != n1 {
		t.Fatalf("a resent sealed append = %d, %v; want %d (a no-op)", again, err, n1)
	}
	part, err := s.StreamRead(ctx, key, at, 1<<20)
	if err != nil || string(part.Data) != "data: secret-1\n\n" || part.Next != n1 || part.Len != n1 || part.End != claim.StreamRunning {
		t.Fatalf("StreamRead of a sealed stream = %+v, %v", part, err)
	}
	n2, err := s.StreamAppend(ctx, key, head.Token, n1, []byte(big), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A bound smaller than the chunk: it comes whole all the same.
	if part, err := s.StreamRead(ctx, key, n1, 100); err != nil || string(part.Data) != big || part.Next != n2 {
		t.Fatalf("StreamRead of a chunk longer than the bound = %d bytes, next %d, %v; want %d, %d", len(part.Data), part.Next, err, len(big), n2)
	}
	// A bound that cuts the second frame: the first alone, then the rest.
	if part, err := s.StreamRead(ctx, key, at, n1-at+50); err != nil || string(part.Data) != "data: secret-1\n\n" || part.Next != n1 {
		t.Fatalf("StreamRead cutting a frame = %+v, %v", part, err)
	}
	raw, err := d.Raw(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{"secret-1", "xxxxxxxx", "hdr-4242", "event-stream", "req-1"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("the raw streamed value holds %q in clear text", plain)
		}
	}
	if err := s.StreamFinish(ctx, key, head.Token, claim.StreamEnded, n2); err != nil {
		t.Fatal(err)
	}
	if err := s.StreamFinish(ctx, key, head.Token, claim.StreamEnded, n2); err != nil {
		t.Fatalf("a resent end = %v", err)
	}
	rec, _, err := s.Get(ctx, key)
	if err != nil || rec.StreamEnd != claim.StreamEnded || string(rec.Body) != "data: secret-1\n\n"+big || rec.Status != 200 ||
		rec.Header.Get("X-Secret-Header") != "hdr-4242" || rec.RequestID != "req-1" {
		t.Fatalf("Get of an ended sealed stream = %+v, %v", rec, err)
	}
	// A follower that read every chunk reads the end (with its frame).
	if part, err := s.StreamRead(ctx, key, n2, 1<<20); err != nil || len(part.Data) != 0 || part.End != claim.StreamEnded || part.Next != part.Len {
		t.Fatalf("StreamRead of the end = %+v, %v", part, err)
	}
	return key, at, n1
}

// testSealedStreamTampered: the ended sealed stream at key, a byte
// flipped, its first chunk (at to n1) dropped, or moved to another key,
// is corrupt; put back, it reads.
func testSealedStreamTampered(t *testing.T, d Deployment, s claim.Backend, key string, at, n1 int) {
	ctx := context.Background()
	raw, _ := d.Raw(ctx, key)
	tampered := func(what string, v []byte) {
		t.Helper()
		d.Plant(ctx, key, v, time.Hour)
		if _, _, err := s.Get(ctx, key); !errors.Is(err, claim.ErrCorrupt) {
			t.Errorf("%s: Get = %v, want ErrCorrupt", what, err)
		}
		if _, err := s.StreamRead(ctx, key, at, 1<<20); !errors.Is(err, claim.ErrCorrupt) {
			t.Errorf("%s: StreamRead = %v, want ErrCorrupt", what, err)
		}
	}
	flip := bytes.Clone(raw)
	flip[n1+30] ^= 1
	tampered("a chunk's byte flipped", flip)
	dropped := append(bytes.Clone(raw[:at]), raw[n1:]...)
	tampered("the first chunk dropped", dropped)
	other := s.Codec().Key("alice", "chat", "moved")
	d.Plant(ctx, other, raw, time.Hour)
	if _, _, err := s.Get(ctx, other); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("a sealed stream moved to another key: %v, want ErrCorrupt", err)
	}
	d.Plant(ctx, key, raw, time.Hour)
	if _, _, err := s.Get(ctx, key); err != nil {
		t.Fatalf("the value put back: %v", err)
	}
}

// testSealedStreamTruncated: a stream that broke off after one chunk,
// its end byte set by hand to "ended": a truncated stream must not pass
// for a whole one.
func testSealedStreamTruncated(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	key2, head2, at2 := startSealedStream(t, s, "k2")
	m, err := s.StreamAppend(ctx, key2, head2.Token, at2, []byte("data: part\n\n"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StreamFinish(ctx, key2, head2.Token, claim.StreamAborted, -1); err != nil {
		t.Fatal(err)
	}
	if rec, _, err := s.Get(ctx, key2); err != nil || rec.StreamEnd != claim.StreamAborted || string(rec.Body) != "data: part\n\n" {
		t.Fatalf("Get of an aborted sealed stream = %+v, %v", rec, err)
	}
	edited, _ := d.Raw(ctx, key2)
	edited[69] = 1 // the end byte, set by hand
	d.Plant(ctx, key2, edited, time.Hour)
	if _, _, err := s.Get(ctx, key2); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("an aborted stream marked ended by hand: Get = %v, want ErrCorrupt", err)
	}
	if _, err := s.StreamRead(ctx, key2, m, 1<<20); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("an aborted stream marked ended by hand: StreamRead at its end = %v, want ErrCorrupt", err)
	}
}

// testSealedStreamWithoutKeys: without the keys a sealed stream (key,
// from at) is unreadable; a store that requires sealing refuses a plain
// one.
func testSealedStreamWithoutKeys(t *testing.T, d Deployment, key string, at int) {
	ctx := context.Background()
	plain := d.Open(t, "sealstream:"+t.Name()+":")
	if _, err := plain.StreamRead(ctx, key, at, 100); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("a sealed stream read without keys = %v, want ErrCorrupt", err)
	}
	strict := sealed(t, d, "sealstream:"+t.Name()+":", true, newKey(t))
	pkey := plain.Codec().Key("alice", "chat", "plain")
	po := NewRecord(t)
	plain.Claim(ctx, pkey, po, time.Minute, claim.Quota{})
	ph := *po
	ph.State, ph.Status = claim.Streamed, 200
	pat, err := plain.StreamStart(ctx, pkey, &ph, time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.StreamRead(ctx, pkey, pat, 100); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("an unsealed stream read where sealing is required = %v, want ErrCorrupt", err)
	}
}
