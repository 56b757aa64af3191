package contract

// The cases on a store's bounds: a full store refuses only new claims,
// and a quota counts new keys only.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// While full, a free key is refused (ErrFull) and nothing is written; a key
// that holds a record is answered from it, and its owner still completes.
func testFullRefusesOnlyNewClaims(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	owner := NewRecord(t)
	held := s.Codec().Key("alice", "route", "held")
	if res, err := s.Claim(ctx, held, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatal(res, err)
	}
	s.SetFull(true)
	defer s.SetFull(false)
	free := s.Codec().Key("alice", "route", "free")
	if res, err := s.Claim(ctx, free, NewRecord(t), time.Minute, claim.Quota{}); !errors.Is(err, claim.ErrFull) || res.Claimed {
		t.Fatalf("claim of a free key while full = %+v, %v; want ErrFull", res, err)
	}
	if got, _, _ := s.Get(ctx, free); got != nil {
		t.Fatal("a refused claim wrote a record")
	}
	res, err := s.Claim(ctx, held, NewRecord(t), time.Minute, claim.Quota{})
	if err != nil || res.Claimed || res.Existing.Token != owner.Token || res.TTL <= 0 {
		t.Fatalf("claim of a held key while full = %+v, %v; want the owner's record with its lease", res, err)
	}
	if _, err := s.Complete(ctx, held, Completed(owner, "done"), time.Hour); err != nil {
		t.Fatalf("completion while full: %v", err)
	}
	res, err = s.Claim(ctx, held, NewRecord(t), time.Minute, claim.Quota{})
	if err != nil || res.Existing == nil || string(res.Existing.Body) != "done" {
		t.Fatalf("replay while full = %+v, %v", res, err)
	}
}

// A quota counts new keys only, shared through Redis, and a claim beyond
// it is undone.
func testQuota(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	q := claim.Quota{Key: s.Codec().QuotaKey("alice", "route"), Limit: 2, Window: time.Hour}
	first := NewRecord(t)
	for i, k := range []string{"a", "b"} {
		rec := NewRecord(t)
		if i == 0 {
			rec = first
		}
		if res, err := s.Claim(ctx, s.Codec().Key("alice", "route", k), rec, time.Minute, q); err != nil || !res.Claimed {
			t.Fatalf("new key %s: %+v, %v", k, res, err)
		}
	}
	// An existing key is answered from its record and does not count.
	if res, err := s.Claim(ctx, s.Codec().Key("alice", "route", "a"), NewRecord(t), time.Minute, q); err != nil || res.Claimed || res.Existing.Token != first.Token {
		t.Fatalf("existing key: %+v, %v", res, err)
	}
	over := s.Codec().Key("alice", "route", "c")
	_, err := s.Claim(ctx, over, NewRecord(t), time.Minute, q)
	qe, ok := errors.AsType[*claim.QuotaError](err)
	if !errors.Is(err, claim.ErrQuota) || !ok || qe.RetryAfter <= 0 || qe.RetryAfter > time.Hour {
		t.Fatalf("third new key: %v, want a QuotaError with the window's rest", err)
	}
	if got, _, _ := s.Get(ctx, over); got != nil {
		t.Fatal("the claim beyond the quota was not undone")
	}
	if res, err := s.Claim(ctx, s.Codec().Key("bob", "route", "c"), NewRecord(t), time.Minute, claim.Quota{Key: s.Codec().QuotaKey("bob", "route"), Limit: 2, Window: time.Hour}); err != nil || !res.Claimed {
		t.Fatalf("another principal: %+v, %v", res, err)
	}
}
