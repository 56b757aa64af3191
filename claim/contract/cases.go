package contract

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
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
	WaitClaimed(t, s, key, fresh, 200*time.Millisecond)
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
	key := s.Codec().Key("alice", "route", "k1")
	if _, err := s.Claim(ctx, key, NewRecord(t), 200*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, key, NewRecord(t), 200*time.Millisecond, claim.Quota{})
	if err != nil || res.Claimed {
		t.Fatalf("claim during the lease = %+v, %v; want the existing record", res, err)
	}
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

// testWatch: a watch is woken when its channel goes live, and by every
// operation that settles or frees the key (complete, release, settle an
// orphan, forget), on every topology (sharded pub/sub on a Cluster). A
// renewal wakes nobody, and a stopped watch is not woken.
func testWatch(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	t.Cleanup(s.Close)
	key := s.Codec().Key("alice", "route", "watched")
	w := s.Watch(ctx, key)
	defer w.Stop()
	watchWoken(t, w, "the channel went live")
	watchQuiet(t, w, "nothing")

	rec := NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, key, rec, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	watchQuiet(t, w, "a claim and a renewal")
	if err := s.Release(ctx, key, rec.Token); err != nil {
		t.Fatal(err)
	}
	watchWoken(t, w, "release")

	rec = NewRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, key, Completed(rec, "done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	watchWoken(t, w, "complete")
	if err := s.Forget(ctx, key, claim.Completed); err != nil {
		t.Fatal(err)
	}
	watchWoken(t, w, "forget")
	testWatchOrphanAndStop(t, s, w, key)
}

// testWatchOrphanAndStop: settling an orphan wakes the watch on key;
// nothing does once it stopped.
func testWatchOrphanAndStop(t *testing.T, s claim.Backend, w claim.Watch, key string) {
	ctx := context.Background()
	orphan := NewRecord(t)
	orphan.Tail = 10 * time.Second
	if _, err := s.Claim(ctx, key, orphan, time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the lease is over", func() bool {
		got, ttl, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(ttl)
	})
	settler := NewRecord(t)
	if err := s.SettleOrphan(ctx, key, orphan, Completed(settler, "outcome unknown"), time.Minute); err != nil {
		t.Fatal(err)
	}
	watchWoken(t, w, "settling an orphan")

	w.Stop()
	other := s.Codec().Key("alice", "route", "other")
	w2 := s.Watch(ctx, other)
	defer w2.Stop()
	<-w2.C() // live
	if err := s.Forget(ctx, key, claim.Completed); err != nil {
		t.Fatal(err)
	}
	watchQuiet(t, w, "an operation after Stop")
}

// watchWoken fails t unless w is woken within 10 s, by what.
func watchWoken(t *testing.T, w claim.Watch, what string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatalf("watch not woken: %s", what)
	}
}

// watchQuiet fails t when w is woken within 100 ms, by what.
func watchQuiet(t *testing.T, w claim.Watch, what string) {
	t.Helper()
	select {
	case <-w.C():
		t.Fatalf("watch woken by %s", what)
	case <-time.After(100 * time.Millisecond):
	}
}

// An in-progress record with a tail stays after its lease, and reports its
// lease left (not its TTL), so a finder can tell a live owner from a gone
// one; renewals keep the tail.
func testTailOutlivesLease(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	owner := NewRecord(t)
	owner.Tail = time.Hour
	if res, err := s.Claim(ctx, key, owner, 300*time.Millisecond, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	res, err := s.Claim(ctx, key, NewRecord(t), time.Second, claim.Quota{})
	if err != nil || res.Claimed || res.Existing.Tail != time.Hour {
		t.Fatalf("second claim = %+v, %v; want the owner's record with its tail", res, err)
	}
	if res.TTL <= 0 || res.TTL > 300*time.Millisecond || res.Existing.Orphaned(res.TTL) {
		t.Fatalf("lease left = %s, want within the 300ms lease, not orphaned", res.TTL)
	}
	if err := s.Renew(ctx, key, owner, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err = s.Claim(ctx, key, NewRecord(t), time.Second, claim.Quota{})
		if err != nil || res.Claimed {
			t.Fatalf("claim after the lease = %+v, %v; want the orphaned record, kept by its tail", res, err)
		}
		if res.Existing.Orphaned(res.TTL) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease never ran out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	got, left, err := s.Get(ctx, key)
	if err != nil || got == nil || !got.Orphaned(left) {
		t.Fatalf("Get of the orphan = %+v, %s, %v; want it orphaned", got, left, err)
	}
}

// SettleOrphan writes only over the orphan it was given, and only while
// its lease is still over.
func testSettleOrphanFenced(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	owner := NewRecord(t)
	owner.Tail = time.Hour
	if _, err := s.Claim(ctx, key, owner, 200*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	settler := NewRecord(t)
	outcome := Completed(settler, "outcome unknown")
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a live owner's record = %v, want ErrLeaseLost", err)
	}
	other := NewRecord(t)
	other.Tail = time.Hour
	poll.Until(t, "the owner's lease runs out", func() bool {
		got, left, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(left)
	})
	if err := s.SettleOrphan(ctx, key, other, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling with another record's token = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); err != nil {
		t.Fatalf("settle orphan: %v", err)
	}
	got, ttl, err := s.Get(ctx, key)
	if err != nil || got == nil || got.State != claim.Completed || got.Token != settler.Token || string(got.Body) != "outcome unknown" {
		t.Fatalf("record after settling = %+v, %v; want the settler's completed record", got, err)
	}
	if ttl < 59*time.Minute {
		t.Errorf("settled record's TTL = %s, want the retention", ttl)
	}
	// The vanished owner comes back: its completion is fenced off.
	if _, err := s.Complete(ctx, key, Completed(owner, "late"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the orphan's owner completing after the settle = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a completed record = %v, want ErrLeaseLost", err)
	}
}

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

// testUnforwardedClaims: a claim marks its record with its lease; one
// whose SET ran more than ConfirmWindow + ClockSkew after its Created time
// (a reply that came too late: its owner never forwarded) is reported
// Unforwarded to the next claim, and ReleaseUnforwarded frees it, fenced:
// a fresh claim is not reported, a renewed one is not either, and one
// renewed since it was read is left alone.
func testUnforwardedClaims(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	s.Health(ctx) // what the store watcher does every second: it measures the clocks, and claims are marked from now
	lease := 10 * time.Second
	keyFresh, keyGhost, keyRenewed := s.Codec().Key("p", "s", "fresh"), s.Codec().Key("p", "s", "ghost"), s.Codec().Key("p", "s", "renewed")
	other := NewRecord(t)
	other.Created = time.Now()

	fresh := NewRecord(t)
	fresh.Created = time.Now()
	if res, err := s.Claim(ctx, keyFresh, fresh, lease, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if rec, _, err := s.Get(ctx, keyFresh); err != nil || rec == nil || rec.Mark != claim.MarkClaimed || rec.Lease != lease {
		t.Fatalf("a claim's record: %+v %v, want MarkClaimed and %s", rec, err, lease)
	}
	if res, _ := s.Claim(ctx, keyFresh, other, lease, claim.Quota{}); res.Claimed || res.Unforwarded {
		t.Fatalf("a claim confirmed in time was reported %+v", res)
	}

	ghost := NewRecord(t)
	ghost.Created = time.Now().Add(-3 * time.Second) // its SET runs 3s after its owner sent it
	if err := planter(t, s).PlantUnconfirmed(ctx, keyGhost, ghost, lease); err != nil {
		t.Fatalf("claim: %v", err)
	}
	res, err := s.Claim(ctx, keyGhost, other, lease, claim.Quota{})
	if err != nil || res.Claimed || !res.Unforwarded {
		t.Fatalf("a claim that ran 3s late: %+v %v, want Unforwarded", res, err)
	}
	if err := s.ReleaseUnforwarded(ctx, keyGhost, res.Existing); err != nil {
		t.Fatalf("release unforwarded: %v", err)
	}
	if res, err := s.Claim(ctx, keyGhost, other, lease, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim after the ghost was freed: %+v %v", res, err)
	}

	renewed := NewRecord(t)
	renewed.Created = time.Now().Add(-3 * time.Second)
	if err := planter(t, s).PlantUnconfirmed(ctx, keyRenewed, renewed, lease); err != nil {
		t.Fatalf("claim: %v", err)
	}
	seen, err := s.Claim(ctx, keyRenewed, other, lease, claim.Quota{})
	if err != nil || !seen.Unforwarded {
		t.Fatalf("before the renewal: %+v %v", seen, err)
	}
	if err := s.Renew(ctx, keyRenewed, renewed, lease); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := s.Get(ctx, keyRenewed); rec.Mark != claim.MarkRenewed {
		t.Fatalf("after a renewal: mark %d, want MarkRenewed", rec.Mark)
	}
	if err := s.ReleaseUnforwarded(ctx, keyRenewed, seen.Existing); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("release of a claim renewed since it was read: %v, want ErrLeaseLost", err)
	}
	if res, _ := s.Claim(ctx, keyRenewed, other, lease, claim.Quota{}); res.Claimed || res.Unforwarded {
		t.Fatalf("a renewed claim was reported %+v", res)
	}

	testReleaseUnconfirmed(t, s, lease)
}

// testReleaseUnconfirmed: a claim whose reply never came is freed by
// ReleaseUnconfirmed, which says when there was nothing of ours.
func testReleaseUnconfirmed(t *testing.T, s claim.Backend, lease time.Duration) {
	ctx := context.Background()
	keyLost := s.Codec().Key("p", "s", "lost")
	lost := NewRecord(t)
	lost.Created = time.Now()
	if _, err := s.Claim(ctx, keyLost, lost, lease, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if found, err := s.ReleaseUnconfirmed(ctx, keyLost, lost.Token); err != nil || !found {
		t.Fatalf("release unconfirmed: %t %v, want found", found, err)
	}
	if found, err := s.ReleaseUnconfirmed(ctx, keyLost, lost.Token); err != nil || found {
		t.Fatalf("release unconfirmed again: %t %v, want not found", found, err)
	}
}

// TakeOver (issue 43) replaces an orphan only once its lease is over and
// only the orphan it was given; what it returns to judge an absent answer
// from is never earlier than the orphan's claim; the vanished owner is
// fenced off; FreeAbsent frees only the taker's claim, and only once the
// age asked for has passed on Redis' clock.
func testTakeOverFenced(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	owner := NewRecord(t)
	owner.Tail = time.Hour
	res, err := s.Claim(ctx, key, owner, 200*time.Millisecond, claim.Quota{})
	if err != nil || !res.Claimed || res.SetAt().IsZero() {
		t.Fatalf("claim = %+v, %v; want claimed, with its SET's time", res, err)
	}
	taker := NewRecord(t)
	taker.Tail = time.Hour
	if _, err := s.TakeOver(ctx, key, owner, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over a live owner's claim = %v, want ErrLeaseLost", err)
	}
	poll.Until(t, "the owner's lease runs out", func() bool {
		got, left, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(left)
	})
	other := NewRecord(t)
	if _, err := s.TakeOver(ctx, key, other, taker, time.Minute, time.Time{}); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("taking over with another record's token = %v, want ErrLeaseLost", err)
	}
	since, err := s.TakeOver(ctx, key, owner, taker, time.Minute, time.Time{})
	if err != nil {
		t.Fatalf("take over: %v", err)
	}
	if since.Before(res.SetAt().Truncate(time.Millisecond)) {
		t.Errorf("since %s is before the orphan's claim at %s: an absent answer could be believed early", since, res.SetAt())
	}
	if _, err := s.Complete(ctx, key, Completed(owner, "late"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the vanished owner completing after the take-over = %v, want ErrLeaseLost", err)
	}
	var early *claim.TooEarlyError
	if err := s.FreeAbsent(ctx, key, taker.Token, since, time.Hour); !errors.As(err, &early) || early.Left < 59*time.Minute {
		t.Fatalf("freeing before the age = %v, want ErrTooEarly with about an hour left", err)
	}
	if err := s.FreeAbsent(ctx, key, owner.Token, since, 0); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("freeing with the old owner's token = %v, want ErrLeaseLost", err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Token != taker.Token {
		t.Fatalf("after refused frees: %+v, want the taker's claim", got)
	}
	if err := s.FreeAbsent(ctx, key, taker.Token, since, 0); err != nil {
		t.Fatalf("free absent: %v", err)
	}
	if got, _, _ := s.Get(ctx, key); got != nil {
		t.Fatalf("after the free: %+v, want the key gone", got)
	}
	testTakeOverCompleted(t, s)
}

// testTakeOverCompleted: taking over a completed record, since is the
// one given, or the store's now without one (or with one in the future).
func testTakeOverCompleted(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	taker := NewRecord(t)
	taker.Tail = time.Hour
	key := s.Codec().Key("alice", "route", "k2")
	first := NewRecord(t)
	if _, err := s.Claim(ctx, key, first, time.Minute, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	unknown := Completed(first, "outcome unknown")
	if _, err := s.Complete(ctx, key, unknown, time.Hour); err != nil {
		t.Fatal(err)
	}
	given := time.Now().Add(-10 * time.Minute).Truncate(time.Millisecond)
	if since, err := s.TakeOver(ctx, key, unknown, taker, time.Minute, given); err != nil || !since.Equal(given) {
		t.Fatalf("take over a completed record = %s, %v; want %s", since, err, given)
	}
	if _, err := s.Complete(ctx, key, unknown, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the completed record's writer again = %v, want ErrLeaseLost", err)
	}
	back := Completed(taker, "outcome unknown")
	if _, err := s.Complete(ctx, key, back, time.Hour); err != nil {
		t.Fatal(err)
	}
	second := NewRecord(t)
	before := time.Now().Add(-time.Second)
	if since, err := s.TakeOver(ctx, key, back, second, time.Minute, time.Now().Add(time.Hour)); err != nil || since.Before(before) || since.After(time.Now().Add(time.Second)) {
		t.Fatalf("take over with a since in the future = %s, %v; want Redis' now", since, err)
	}
}

// A streamed record (issue 44) replaces its owner's claim only, takes
// appends fenced on the owner's token and the stored length (a resent
// append is a no-op), is read by anyone from any offset, ends once, and
// counts as aborted once its owner's lease runs out on Redis' clock: no
// append lands after that.
func testStreamedRecords(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "chat", "k1")
	owner := NewRecord(t)
	if res, err := s.Claim(ctx, key, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *owner
	head.State, head.Status = claim.Streamed, 200
	head.Header = http.Header{"Content-Type": {"text/event-stream"}}
	stranger := head
	stranger.Token[0]++
	if _, err := s.StreamStart(ctx, key, &stranger, time.Hour, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("a stream started by another token = %v, want ErrLeaseLost", err)
	}
	at, err := s.StreamStart(ctx, key, &head, time.Hour, 300*time.Millisecond)
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
	if err := s.Renew(ctx, key, owner, time.Minute); err != nil {
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
