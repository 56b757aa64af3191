package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// On a sealing store a streamed record seals its head and each chunk as
// it is stored: the raw value holds none of the answer, readers get every
// chunk opened as it lands (one longer than a read's bound whole), and a
// value moved to another key, a frame edited, dropped or moved, or an end
// byte set by hand over a stream that broke off does not open.
func testSealedStreams(t *testing.T, c redis.UniversalClient, _ *redisstore.Store) {
	ctx := context.Background()
	s := sealed(t, c, "sealstream:"+t.Name()+":", false, newKey(t))
	start := func(k string) (string, claim.Record, int) {
		t.Helper()
		key := s.Codec().Key("alice", "chat", k)
		owner := contract.NewRecord(t)
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
	key, head, at := start("k1")
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
	raw, err := c.Get(ctx, key).Bytes()
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
	raw, _ = c.Get(ctx, key).Bytes()
	tampered := func(what string, v []byte) {
		t.Helper()
		c.Set(ctx, key, v, time.Hour)
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
	c.Set(ctx, other, raw, time.Hour)
	if _, _, err := s.Get(ctx, other); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("a sealed stream moved to another key: %v, want ErrCorrupt", err)
	}
	c.Set(ctx, key, raw, time.Hour)
	if _, _, err := s.Get(ctx, key); err != nil {
		t.Fatalf("the value put back: %v", err)
	}

	// A stream that broke off after one chunk, its end byte set by hand
	// to "ended": a truncated stream must not pass for a whole one.
	key2, head2, at2 := start("k2")
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
	c.SetRange(ctx, key2, 69, "\x01")
	if _, _, err := s.Get(ctx, key2); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("an aborted stream marked ended by hand: Get = %v, want ErrCorrupt", err)
	}
	if _, err := s.StreamRead(ctx, key2, m, 1<<20); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("an aborted stream marked ended by hand: StreamRead at its end = %v, want ErrCorrupt", err)
	}

	// Without the keys a sealed stream is unreadable; a store that
	// requires sealing refuses a plain one.
	plain := redisstore.New(c, "sealstream:"+t.Name()+":")
	if _, err := plain.StreamRead(ctx, key, at, 100); !errors.Is(err, claim.ErrCorrupt) {
		t.Errorf("a sealed stream read without keys = %v, want ErrCorrupt", err)
	}
	strict := sealed(t, c, "sealstream:"+t.Name()+":", true, newKey(t))
	pkey := plain.Codec().Key("alice", "chat", "plain")
	po := contract.NewRecord(t)
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

// A streamed record longer than a store reads back (WithStreamReadLimit)
// is never transferred: the claim answers a RecordError (too_large) and
// claims nothing; a store without the bound reads it as before (issue 55).
func TestStreamReadLimit(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	ctx := context.Background()
	s := redisstore.New(c, "idem:")
	defer s.Close()
	key := s.Codec().Key("alice", "chat", "long")
	owner := contract.NewRecord(t)
	if res, err := s.Claim(ctx, key, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *owner
	head.State, head.Status = claim.Streamed, 200
	head.Header = http.Header{"Content-Type": {"text/event-stream"}}
	at, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.StreamAppend(ctx, key, head.Token, at, []byte(strings.Repeat("x", 4096)), time.Minute); err != nil {
		t.Fatal(err)
	}
	limited := redisstore.New(c, "idem:", claim.WithStreamReadLimit(1024))
	defer limited.Close()
	retry := contract.NewRecord(t)
	_, err = limited.Claim(ctx, key, retry, time.Minute, claim.Quota{})
	var re *claim.RecordError
	if !errors.As(err, &re) || re.Reason != claim.ReasonTooLarge || !errors.Is(err, claim.ErrCorrupt) {
		t.Fatalf("claiming a 4 KiB stream with a 1 KiB read limit = %v, want a too_large RecordError", err)
	}
	res, err := s.Claim(ctx, key, retry, time.Minute, claim.Quota{})
	if err != nil || res.Claimed || res.Existing == nil || len(res.Existing.Body) != 4096 {
		t.Fatalf("without the limit = %+v, %v; want the stream read back", res, err)
	}
}
