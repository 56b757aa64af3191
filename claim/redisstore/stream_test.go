package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/redistest"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// startedOnRedis starts a real Redis, a store on it (closed with t) and
// a stream under the idempotency key id: the client, the store, the
// stored key, the owner's head and the length to append at.
func startedOnRedis(t *testing.T, id string) (*redis.Client, *redisstore.Store, string, claim.Record, int) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, "idem:")
	t.Cleanup(s.Close)
	key := s.Codec().Key("alice", "chat", id)
	head, at := contract.StartedStream(t, s, key)
	return c, s, key, head, at
}

// A streamed record longer than a store reads back (WithStreamReadLimit)
// is never transferred: the claim answers a RecordError (too_large) and
// claims nothing; a store without the bound reads it as before (issue 55).
func TestStreamReadLimit(t *testing.T) {
	c, s, key, head, at := startedOnRedis(t, "long")
	ctx := context.Background()
	if _, err := s.StreamAppend(ctx, key, head.Token, at, []byte(strings.Repeat("x", 4096)), time.Minute); err != nil {
		t.Fatal(err)
	}
	limited := redisstore.New(c, "idem:", claim.WithStreamReadLimit(1024))
	defer limited.Close()
	retry := contract.NewRecord(t)
	_, err := limited.Claim(ctx, key, retry, time.Minute, claim.Quota{})
	var re *claim.RecordError
	if !errors.As(err, &re) || re.Reason != claim.ReasonTooLarge || !errors.Is(err, claim.ErrCorrupt) {
		t.Fatalf("claiming a 4 KiB stream with a 1 KiB read limit = %v, want a too_large RecordError", err)
	}
	res, err := s.Claim(ctx, key, retry, time.Minute, claim.Quota{})
	if err != nil || res.Claimed || res.Existing == nil || len(res.Existing.Body) != 4096 {
		t.Fatalf("without the limit = %+v, %v; want the stream read back", res, err)
	}
}

// TestAppendAtAnotherLengthWritesNothing: the fenced append appends first
// and checks the length it finds after (one command less for every
// event), so an append at another length (a resent one whose first send
// landed, or a wrong one) puts the value back as it was: the same bytes
// and the record's TTL, on real Redis.
func TestAppendAtAnotherLengthWritesNothing(t *testing.T) {
	c, s, key, head, at := startedOnRedis(t, "resent")
	ctx := context.Background()
	n, err := s.StreamAppend(ctx, key, head.Token, at, []byte("data: 1\n\n"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := c.Get(ctx, key).Val()
	for _, tc := range []struct {
		at   int
		data string
	}{{at, "data: 1\n\n"}, {n + 1, "x"}, {n - 1, strings.Repeat("y", 300)}} {
		got, err := s.StreamAppend(ctx, key, head.Token, tc.at, []byte(tc.data), time.Minute)
		var le *claim.StreamLengthError
		if !(tc.at == at && err == nil && got == n) && !(errors.As(err, &le) && le.Len == n) {
			t.Fatalf("append of %d bytes at %d over %d = %d, %v", len(tc.data), tc.at, n, got, err)
		}
		if v := c.Get(ctx, key).Val(); v != want {
			t.Fatalf("append at %d: the value is %q, want it as it was, %q", tc.at, v, want)
		}
		if ttl := c.PTTL(ctx, key).Val(); ttl < 59*time.Minute {
			t.Fatalf("append at %d: PTTL %v, want the record's hour kept", tc.at, ttl)
		}
	}
}
