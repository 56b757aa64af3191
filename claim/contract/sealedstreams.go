package contract

// The cases on sealed streams: the head and every chunk sealed, read
// whole, and refused when tampered with, truncated, or read without the
// keys.

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

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
