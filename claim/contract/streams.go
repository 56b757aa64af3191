package contract

// The cases on streamed records: a stream replaces its owner's claim,
// grows by fenced appends, ends once, and lapses with its owner.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
)

// A streamed record (issue 44) replaces its owner's claim only, takes
// appends fenced on the owner's token and the stored length (a resent
// append is a no-op), is read by anyone from any offset, ends once, and
// counts as aborted once its owner's lease runs out on Redis' clock: no
// append lands after that.
func testStreamedRecords(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "chat", "k1")
	head := claimedHead(t, s, key)
	stranger := head
	stranger.Token[0]++
	if _, err := s.StreamStart(ctx, key, &stranger, time.Hour, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("a stream started by another token = %v, want ErrLeaseLost", err)
	}
	// A lease the appends below renew (each asks a minute), long enough
	// for a loaded machine to get to them before it runs out.
	at, err := s.StreamStart(ctx, key, &head, time.Hour, 2*time.Second)
	if err != nil || at <= 0 {
		t.Fatalf("StreamStart = %d, %v", at, err)
	}
	if again, err := s.StreamStart(ctx, key, &head, time.Hour, time.Minute); err != nil || again != at {
		t.Fatalf("a resent StreamStart = %d, %v; want %d, nil", again, err, at)
	}
	n, err := s.StreamAppend(ctx, key, head.Token, at, []byte("data: 1\n\n"), time.Minute)
	if err != nil || n != at+9 {
		t.Fatalf("append = %d, %v", n, err)
	}
	if again, err := s.StreamAppend(ctx, key, head.Token, at, []byte("data: 1\n\n"), time.Minute); err != nil || again != n {
		t.Fatalf("the same append resent = %d, %v; want %d (a no-op)", again, err, n)
	}
	if _, err := s.StreamAppend(ctx, key, stranger.Token, n, []byte("x"), time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("an append by another token = %v, want ErrLeaseLost", err)
	}
	var le *claim.StreamLengthError
	if _, err := s.StreamAppend(ctx, key, head.Token, n+1, []byte("x"), time.Minute); !errors.As(err, &le) || le.Len != n {
		t.Fatalf("an append at the wrong length = %v, want StreamLengthError{%d}", err, n)
	}
	owner := head // the claim the stream replaced
	owner.State, owner.Status, owner.Header = claim.InProgress, 0, nil
	if err := s.Renew(ctx, key, &owner, time.Minute); err != nil {
		t.Fatalf("the old claim's renewal racing the stream = %v, want nil (as after a completion)", err)
	}
	rec, _, err := s.Get(ctx, key)
	if err != nil || rec.State != claim.Streamed || rec.StreamEnd != claim.StreamRunning || string(rec.Body) != "data: 1\n\n" ||
		rec.Status != 200 || rec.Header.Get("Content-Type") != "text/event-stream" || rec.RequestID != "req-1" || rec.StreamLen != n || rec.AliveUntil.IsZero() {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
	if rec.Orphaned(0) {
		t.Fatal("a streamed record counts as an orphan")
	}
	part, err := s.StreamRead(ctx, key, at+6, 100)
	if err != nil || string(part.Data) != "1\n\n" || part.Len != n || part.End != claim.StreamRunning {
		t.Fatalf("StreamRead = %+v, %v", part, err)
	}
	testStreamEnds(t, s, key, head.Token, n)
	testStreamOwnerLapses(t, s)
}

// testStreamEnds: a running stream of length n is never released; its
// normal end is fenced on its length, and nothing is appended after it.
func testStreamEnds(t *testing.T, s claim.Backend, key string, token claim.Token, n int) {
	ctx := context.Background()
	if err := s.Release(ctx, key, token); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("releasing a stream = %v, want ErrLeaseLost (never freed)", err)
	}
	if err := s.StreamFinish(ctx, key, token, claim.StreamEnded, n+1); err == nil {
		t.Fatal("a normal end at the wrong length was recorded")
	}
	if err := s.StreamFinish(ctx, key, token, claim.StreamEnded, n); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StreamAppend(ctx, key, token, n, []byte("late"), time.Minute); !errors.Is(err, claim.ErrStreamOver) {
		t.Fatalf("an append after the end = %v, want ErrStreamOver", err)
	}
	rec, ttl, err := s.Get(ctx, key)
	if err != nil || rec.StreamEnd != claim.StreamEnded || rec.Completed.IsZero() || ttl < 50*time.Minute {
		t.Fatalf("after the end: %+v ttl %s, %v", rec, ttl, err)
	}
}

// testStreamOwnerLapses: the owner's lease runs out, readers take the
// stream for aborted, and the owner's next append does not land.
func testStreamOwnerLapses(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key2 := s.Codec().Key("alice", "chat", "k2")
	o2 := NewRecord(t)
	if _, err := s.Claim(ctx, key2, o2, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	h2 := *o2
	h2.State, h2.Status = claim.Streamed, 200
	at2, err := s.StreamStart(ctx, key2, &h2, time.Hour, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the stream's owner lease runs out", func() bool {
		p, err := s.StreamRead(ctx, key2, at2, 10)
		return err == nil && p.End == claim.StreamAborted
	})
	if _, err := s.StreamAppend(ctx, key2, h2.Token, at2, []byte("late"), time.Minute); !errors.Is(err, claim.ErrStreamOver) {
		t.Fatalf("an append after the lease ran out = %v, want ErrStreamOver", err)
	}
	if rec, _, err := s.Get(ctx, key2); err != nil || rec.StreamEnd != claim.StreamAborted || len(rec.Body) != 0 {
		t.Fatalf("after the lease ran out: %+v, %v", rec, err)
	}
}
