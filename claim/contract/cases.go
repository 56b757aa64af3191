package contract

// The cases on the store alone, on one key's life: claimed, completed,
// renewed, released, lapsed, and claimed by many at once. By area beside
// them: watch.go, orphans.go, limits.go, streams.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

func testClaimThenConflict(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	first := NewRecord(t)
	res, err := s.Claim(ctx, key, first, 10*time.Second, claim.Quota{})
	if err != nil || !res.Claimed {
		t.Fatalf("first claim = %+v, %v; want claimed", res, err)
	}
	second := NewRecord(t)
	res, err = s.Claim(ctx, key, second, 10*time.Second, claim.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Claimed {
		t.Fatal("second claim with another token was granted")
	}
	if res.Existing.Token != first.Token || res.Existing.State != claim.InProgress {
		t.Errorf("existing = %+v, want the first owner's in-progress record", res.Existing)
	}
	if res.TTL <= 0 || res.TTL > 10*time.Second {
		t.Errorf("TTL = %s, want within the 10s lease", res.TTL)
	}
}

func testResentClaimIsOurs(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	// What go-redis does after a lost reply: the same command again.
	res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{})
	if err != nil || !res.Claimed {
		t.Fatalf("resent claim = %+v, %v; want claimed (it is our own record)", res, err)
	}
}

func testCompleteAndGet(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	how, err := s.Complete(ctx, key, Completed(rec, `{"id":1}`), time.Hour)
	if err != nil || how != claim.Stored {
		t.Fatalf("complete = %v, %v; want Stored", how, err)
	}
	got, ttl, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != claim.Completed || got.Status != 201 || string(got.Body) != `{"id":1}` ||
		got.Header.Get("Content-Type") != "application/json" || strings.Join(got.Header["X-Charge"], ",") != "a,b" {
		t.Errorf("stored record = %+v", got)
	}
	if ttl <= 10*time.Second || ttl > time.Hour {
		t.Errorf("TTL after complete = %s, want the 1h retention", ttl)
	}
	// Any later claim sees the completed record.
	res, err := s.Claim(ctx, key, NewRecord(t), 10*time.Second, claim.Quota{})
	if err != nil || res.Claimed || res.Existing.State != claim.Completed {
		t.Fatalf("claim after complete = %+v, %v", res, err)
	}
}

func testResentCompleteIsSuccess(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	done := Completed(rec, "x")
	for i := range 2 {
		if how, err := s.Complete(ctx, key, done, time.Hour); err != nil || how != claim.Stored {
			t.Fatalf("complete #%d = %v, %v; want Stored", i+1, how, err)
		}
	}
}

func testRenewFenced(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 2*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, key, rec, time.Minute); err != nil {
		t.Fatalf("owner renew: %v", err)
	}
	if _, ttl, _ := s.Get(ctx, key); ttl <= 2*time.Second {
		t.Errorf("TTL after renew = %s, want about a minute", ttl)
	}
	other := &claim.Record{State: claim.InProgress}
	other.Token[0] = 1
	if err := s.Renew(ctx, key, other, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("renew with another token = %v, want ErrLeaseLost", err)
	}
	if err := s.Renew(ctx, s.Codec().Key("alice", "route", "absent"), rec, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("renew of a missing key = %v, want ErrLeaseLost", err)
	}
}

func testReleaseFenced(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	var other claim.Token
	if err := s.Release(ctx, key, other); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("release with another token = %v, want ErrLeaseLost", err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil {
		t.Fatal("a foreign release deleted the record")
	}
	if err := s.Release(ctx, key, rec.Token); err != nil {
		t.Fatalf("owner release: %v", err)
	}
	if got, _, _ := s.Get(ctx, key); got != nil {
		t.Fatal("record still there after release")
	}
	if err := s.Release(ctx, key, rec.Token); err != nil {
		t.Errorf("second release (resent) = %v, want nil", err)
	}
	// A completed record is never released.
	rec2 := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec2, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, key, Completed(rec2, "x"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, rec2.Token); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("release of a completed record = %v, want ErrLeaseLost", err)
	}
}

func testStaleOwnerAfterTakeover(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	stale := NewRecord(t)
	if _, err := s.Claim(ctx, key, stale, 200*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	fresh := NewRecord(t)
	// The new owner's lease outlasts the stale writes below, however slow
	// the machine: they must find it live.
	WaitClaimed(t, s, key, fresh, time.Minute)
	if _, err := s.Complete(ctx, key, Completed(stale, "stale"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("stale complete = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, key, stale.Token); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("stale release = %v, want ErrLeaseLost", err)
	}
	if err := s.Renew(ctx, key, stale, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("stale renew = %v, want ErrLeaseLost", err)
	}
	got, _, err := s.Get(ctx, key)
	if err != nil || got == nil || got.Token != fresh.Token || got.State != claim.InProgress {
		t.Fatalf("after stale writes the record is %+v, %v; want the new owner's, untouched", got, err)
	}
}

func testLeaseLapses(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	lease := 200 * time.Millisecond
	key := whileLive(t, s, lease, func(key string) func() {
		if _, err := s.Claim(ctx, key, NewRecord(t), lease, claim.Quota{}); err != nil {
			t.Fatal(err)
		}
		res, err := s.Claim(ctx, key, NewRecord(t), lease, claim.Quota{})
		return func() {
			if err != nil || res.Claimed {
				t.Fatalf("claim during the lease = %+v, %v; want the existing record", res, err)
			}
		}
	})
	WaitClaimed(t, s, key, NewRecord(t), time.Second)
}

func testCompleteAfterLapse(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 100*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lease never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	how, err := s.Complete(ctx, key, Completed(rec, "late"), time.Hour)
	if err != nil || how != claim.StoredAfterLapse {
		t.Fatalf("complete after lapse = %v, %v; want StoredAfterLapse", how, err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || string(got.Body) != "late" {
		t.Fatalf("record after late complete = %+v", got)
	}
}

func testConcurrentClaims(t *testing.T, s claim.Backend) {
	key := s.Codec().Key("alice", "route", "k1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for range 50 {
		wg.Go(func() {
			res, err := s.Claim(context.Background(), key, NewRecord(t), 10*time.Second, claim.Quota{})
			if err != nil {
				t.Error(err)
				return
			}
			if res.Claimed {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d of 50 concurrent claims won, want exactly 1", won)
	}
}

// testConcurrentPairs runs claim, complete and get on distinct keys from 32
// goroutines, so that with coalescing many share a pipeline: each must get
// its own result (a claim its own key, a get its own body), and each
// completion must find its own claim (Stored, never StoredAfterLapse: the
// claim was applied first).
func testConcurrentPairs(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 40 {
				name := fmt.Sprintf("k-%d-%d", g, i)
				key := s.Codec().Key("alice", "route", name)
				rec := NewRecord(t)
				res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{})
				if err != nil || !res.Claimed {
					t.Errorf("claim %s = %+v, %v", name, res, err)
					return
				}
				how, err := s.Complete(ctx, key, Completed(rec, name), time.Minute)
				if err != nil || how != claim.Stored {
					t.Errorf("complete %s = %v, %v; want Stored", name, how, err)
					return
				}
				got, _, err := s.Get(ctx, key)
				if err != nil || got == nil || string(got.Body) != name || got.Token != rec.Token {
					t.Errorf("get %s = %+v, %v; want its own record", name, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
