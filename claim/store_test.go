package claim_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// backend is one store deployment the contract suite runs against. setup
// starts it once; every test then gets its own key prefix on it.
type backend struct {
	name  string
	setup func(t *testing.T) redis.UniversalClient
}

func clientFor(t *testing.T, cfg claim.ClientOptions) redis.UniversalClient {
	c, _ := claim.NewClient(cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

var backends = []backend{
	{"embedded", func(t *testing.T) redis.UniversalClient {
		e, err := claim.StartEmbedded()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return clientFor(t, claim.ClientOptions{Addrs: []string{e.Addr()}})
	}},
	{"redis-server", func(t *testing.T) redis.UniversalClient {
		return clientFor(t, claim.ClientOptions{Addrs: []string{redistest.Start(t).Addr}})
	}},
	// Every operation touches one key, so on a Cluster each is served by
	// the key's slot owner; a cross-slot operation would fail here.
	{"cluster", func(t *testing.T) redis.UniversalClient {
		return clientFor(t, claim.ClientOptions{Addrs: redistest.StartCluster(t, 3, 1).Addrs()})
	}},
	{"sentinel", func(t *testing.T) redis.UniversalClient {
		s := redistest.StartSentinel(t, 1)
		return clientFor(t, claim.ClientOptions{Addrs: s.SentinelAddrs(), MasterName: s.MasterName})
	}},
}

// TestContract runs every store test against the embedded store, a real
// redis-server, a 3-master Cluster with replicas and a Sentinel-managed
// master: the same behaviour is required of all.
func TestContract(t *testing.T) {
	tests := []struct {
		name string
		fn   func(t *testing.T, c redis.UniversalClient, s *claim.Store)
	}{
		{"ClaimThenConflict", testClaimThenConflict},
		{"ResentClaimIsOurs", testResentClaimIsOurs},
		{"CompleteAndGet", testCompleteAndGet},
		{"ResentCompleteIsSuccess", testResentCompleteIsSuccess},
		{"RenewFenced", testRenewFenced},
		{"ReleaseFenced", testReleaseFenced},
		{"StaleOwnerAfterTakeover", testStaleOwnerAfterTakeover},
		{"LeaseLapses", testLeaseLapses},
		{"CompleteAfterLapse", testCompleteAfterLapse},
		{"ForeignValueNeverTouched", testForeignValue},
		{"ConcurrentClaimsOneWinner", testConcurrentClaims},
		{"ConcurrentPairsKeepTheirResults", testConcurrentPairs},
		{"WatchWakesOnEverySettlement", testWatch},
		{"TailOutlivesLease", testTailOutlivesLease},
		{"SettleOrphanFenced", testSettleOrphanFenced},
		{"SealedRecords", testSealedRecords},
		{"KeyRotation", testKeyRotation},
		{"SecretKeyDerivation", testSecretKeyDerivation},
		{"SealingRequired", testSealingRequired},
		{"FullRefusesOnlyNewClaims", testFullRefusesOnlyNewClaims},
		{"Quota", testQuota},
		{"UnforwardedClaims", testUnforwardedClaims},
		{"UnforwardedWhateverTheReadersClock", testUnforwardedReadersClock},
		{"UnmarkedWhileTheClockIsOff", testUnmarkedWhileClockOff},
		{"UnforwardedByScript", testUnforwardedByScript},
		{"OwnRoundTripDecides", testOwnRoundTripDecides},
		{"EpochMarkers", testEpochMarkers},
		{"CompressedRecords", testCompressedRecords},
		{"CompactRecords", testCompactRecords},
		{"KeyedFingerprints", testKeyedFingerprints},
		{"TakeOverFenced", testTakeOverFenced},
		{"TakeOverFencedOnExpiry", testTakeOverFencedOnExpiry},
		{"StreamedRecords", testStreamedRecords},
		{"SealedStreams", testSealedStreams},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			c := b.setup(t)
			// Every test runs with operations coalesced into pipelines (the
			// default) and sent one by one (store.pipeline: false).
			for _, mode := range []struct {
				name      string
				pipelined bool
			}{{"pipelined", true}, {"direct", false}} {
				for _, tt := range tests {
					t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
						t.Parallel()
						tt.fn(t, c, claim.New(c, "test:"+mode.name+":"+tt.name+":", claim.WithPipeline(mode.pipelined)))
					})
				}
			}
		})
	}
}

func newRecord(t *testing.T) *claim.Record {
	t.Helper()
	r := &claim.Record{State: claim.InProgress, Created: time.UnixMilli(1_700_000_000_000), RequestID: "req-1"}
	rand.Read(r.Token[:])
	r.Fingerprint[0] = 7
	return r
}

func completed(r *claim.Record, body string) *claim.Record {
	c := *r
	c.State = claim.Completed
	c.Completed = r.Created.Add(time.Second)
	c.Status = 201
	c.Header = http.Header{"Content-Type": {"application/json"}, "X-Charge": {"a", "b"}}
	c.Body = []byte(body)
	return &c
}

func testClaimThenConflict(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	first := newRecord(t)
	res, err := s.Claim(ctx, key, first, 10*time.Second, claim.Quota{})
	if err != nil || !res.Claimed {
		t.Fatalf("first claim = %+v, %v; want claimed", res, err)
	}
	second := newRecord(t)
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

func testResentClaimIsOurs(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	rec := newRecord(t)
	if res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	// What go-redis does after a lost reply: the same command again.
	res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{})
	if err != nil || !res.Claimed {
		t.Fatalf("resent claim = %+v, %v; want claimed (it is our own record)", res, err)
	}
}

func testCompleteAndGet(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	rec := newRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	how, err := s.Complete(ctx, key, completed(rec, `{"id":1}`), time.Hour)
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
	res, err := s.Claim(ctx, key, newRecord(t), 10*time.Second, claim.Quota{})
	if err != nil || res.Claimed || res.Existing.State != claim.Completed {
		t.Fatalf("claim after complete = %+v, %v", res, err)
	}
}

func testResentCompleteIsSuccess(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	rec := newRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	done := completed(rec, "x")
	for i := range 2 {
		if how, err := s.Complete(ctx, key, done, time.Hour); err != nil || how != claim.Stored {
			t.Fatalf("complete #%d = %v, %v; want Stored", i+1, how, err)
		}
	}
}

func testRenewFenced(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	rec := newRecord(t)
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
	if err := s.Renew(ctx, s.Key("alice", "route", "absent"), rec, time.Minute); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("renew of a missing key = %v, want ErrLeaseLost", err)
	}
}

func testReleaseFenced(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	rec := newRecord(t)
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
	rec2 := newRecord(t)
	if _, err := s.Claim(ctx, key, rec2, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, key, completed(rec2, "x"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key, rec2.Token); !errors.Is(err, claim.ErrLeaseLost) {
		t.Errorf("release of a completed record = %v, want ErrLeaseLost", err)
	}
}

func testStaleOwnerAfterTakeover(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	stale := newRecord(t)
	if _, err := s.Claim(ctx, key, stale, 200*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	fresh := newRecord(t)
	waitClaimed(t, s, key, fresh, 200*time.Millisecond)
	if _, err := s.Complete(ctx, key, completed(stale, "stale"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
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

// waitClaimed claims key for rec, retrying until an earlier lease lapses.
func waitClaimed(t *testing.T, s *claim.Store, key string, rec *claim.Record, lease time.Duration) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		res, err := s.Claim(context.Background(), key, rec, lease, claim.Quota{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the earlier lease never lapsed")
}

func testLeaseLapses(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	if _, err := s.Claim(ctx, key, newRecord(t), 200*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, key, newRecord(t), 200*time.Millisecond, claim.Quota{})
	if err != nil || res.Claimed {
		t.Fatalf("claim during the lease = %+v, %v; want the existing record", res, err)
	}
	waitClaimed(t, s, key, newRecord(t), time.Second)
}

func testCompleteAfterLapse(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	rec := newRecord(t)
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
	how, err := s.Complete(ctx, key, completed(rec, "late"), time.Hour)
	if err != nil || how != claim.StoredAfterLapse {
		t.Fatalf("complete after lapse = %v, %v; want StoredAfterLapse", how, err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || string(got.Body) != "late" {
		t.Fatalf("record after late complete = %+v", got)
	}
}

func testForeignValue(t *testing.T, c redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	foreign := "\x01\x01\x00not a record of ours at all, but with our version byte"
	for _, v := range []string{"hello", foreign, ""} {
		if err := c.Set(ctx, key, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		rec := newRecord(t)
		if _, err := s.Claim(ctx, key, rec, time.Second, claim.Quota{}); !errors.Is(err, claim.ErrCorrupt) {
			t.Errorf("claim over %q = %v, want ErrCorrupt", v, err)
		}
		if _, err := s.Complete(ctx, key, completed(rec, "x"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
			t.Errorf("complete over %q = %v, want ErrLeaseLost", v, err)
		}
		if err := s.Release(ctx, key, rec.Token); !errors.Is(err, claim.ErrLeaseLost) {
			t.Errorf("release over %q = %v, want ErrLeaseLost", v, err)
		}
		if got, err := c.Get(ctx, key).Result(); err != nil || got != v {
			t.Errorf("foreign value changed to %q, %v", got, err)
		}
	}
}

func testConcurrentClaims(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	key := s.Key("alice", "route", "k1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for range 50 {
		wg.Go(func() {
			res, err := s.Claim(context.Background(), key, newRecord(t), 10*time.Second, claim.Quota{})
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
func testConcurrentPairs(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 40 {
				name := fmt.Sprintf("k-%d-%d", g, i)
				key := s.Key("alice", "route", name)
				rec := newRecord(t)
				res, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{})
				if err != nil || !res.Claimed {
					t.Errorf("claim %s = %+v, %v", name, res, err)
					return
				}
				how, err := s.Complete(ctx, key, completed(rec, name), time.Minute)
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
func testWatch(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	t.Cleanup(s.Close)
	key := s.Key("alice", "route", "watched")
	w := s.Watch(ctx, key)
	defer w.Stop()
	woken := func(what string) {
		t.Helper()
		select {
		case <-w.C:
		case <-time.After(10 * time.Second):
			t.Fatalf("watch not woken: %s", what)
		}
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case <-w.C:
			t.Fatalf("watch woken by %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
	woken("the channel went live")
	quiet("nothing")

	rec := newRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, key, rec, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	quiet("a claim and a renewal")
	if err := s.Release(ctx, key, rec.Token); err != nil {
		t.Fatal(err)
	}
	woken("release")

	rec = newRecord(t)
	if _, err := s.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, key, completed(rec, "done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	woken("complete")
	if err := s.Forget(ctx, key, claim.Completed); err != nil {
		t.Fatal(err)
	}
	woken("forget")

	orphan := newRecord(t)
	orphan.Tail = 10 * time.Second
	if _, err := s.Claim(ctx, key, orphan, time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the lease is over", func() bool {
		got, ttl, err := s.Get(ctx, key)
		return err == nil && got != nil && got.Orphaned(ttl)
	})
	settler := newRecord(t)
	if err := s.SettleOrphan(ctx, key, orphan, completed(settler, "outcome unknown"), time.Minute); err != nil {
		t.Fatal(err)
	}
	woken("settling an orphan")

	w.Stop()
	other := s.Key("alice", "route", "other")
	w2 := s.Watch(ctx, other)
	defer w2.Stop()
	<-w2.C // live
	if err := s.Forget(ctx, key, claim.Completed); err != nil {
		t.Fatal(err)
	}
	quiet("an operation after Stop")
}

func TestKeyFramingAndPrivacy(t *testing.T) {
	s := claim.New(nil, "idem:")
	a := s.Key("ab", "route", "c")
	b := s.Key("a", "route", "bc")
	if a == b {
		t.Fatal("(ab, c) and (a, bc) share a key: inputs are not framed")
	}
	if s.Key("alice", "r1", "k") == s.Key("alice", "r2", "k") {
		t.Error("scope does not separate keys")
	}
	if s.Key("alice", "r", "k") == s.Key("bob", "r", "k") {
		t.Error("principal does not separate keys")
	}
	k := s.Key("alice", "route", "secret-key")
	if !strings.HasPrefix(k, "idem:") || len(k) != len("idem:")+64 || strings.Contains(k, "alice") || strings.Contains(k, "secret") {
		t.Errorf("key %q must be the prefix and a hex SHA-256, nothing raw", k)
	}
}

func TestStoreUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	c, _ := claim.NewClient(claim.ClientOptions{Addrs: []string{srv.Addr}})
	defer c.Close()
	s := claim.New(c, "test:")
	srv.Stop()
	_, err := s.Claim(context.Background(), s.Key("a", "r", "k"), newRecord(t), time.Second, claim.Quota{})
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("claim with Redis down = %v, want ErrUnavailable", err)
	}
	if err := s.Ping(context.Background()); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("ping with Redis down = %v, want ErrUnavailable", err)
	}
}

// An in-progress record with a tail stays after its lease, and reports its
// lease left (not its TTL), so a finder can tell a live owner from a gone
// one; renewals keep the tail.
func testTailOutlivesLease(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	owner := newRecord(t)
	owner.Tail = time.Hour
	if res, err := s.Claim(ctx, key, owner, 300*time.Millisecond, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	res, err := s.Claim(ctx, key, newRecord(t), time.Second, claim.Quota{})
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
		res, err = s.Claim(ctx, key, newRecord(t), time.Second, claim.Quota{})
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
func testSettleOrphanFenced(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	key := s.Key("alice", "route", "k1")
	owner := newRecord(t)
	owner.Tail = time.Hour
	if _, err := s.Claim(ctx, key, owner, 200*time.Millisecond, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	settler := newRecord(t)
	outcome := completed(settler, "outcome unknown")
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a live owner's record = %v, want ErrLeaseLost", err)
	}
	other := newRecord(t)
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
	if _, err := s.Complete(ctx, key, completed(owner, "late"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("the orphan's owner completing after the settle = %v, want ErrLeaseLost", err)
	}
	if err := s.SettleOrphan(ctx, key, owner, outcome, time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
		t.Fatalf("settling a completed record = %v, want ErrLeaseLost", err)
	}
}

// While full, a free key is refused (ErrFull) and nothing is written; a key
// that holds a record is answered from it, and its owner still completes.
func testFullRefusesOnlyNewClaims(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	owner := newRecord(t)
	held := s.Key("alice", "route", "held")
	if res, err := s.Claim(ctx, held, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatal(res, err)
	}
	s.SetFull(true)
	defer s.SetFull(false)
	free := s.Key("alice", "route", "free")
	if res, err := s.Claim(ctx, free, newRecord(t), time.Minute, claim.Quota{}); !errors.Is(err, claim.ErrFull) || res.Claimed {
		t.Fatalf("claim of a free key while full = %+v, %v; want ErrFull", res, err)
	}
	if got, _, _ := s.Get(ctx, free); got != nil {
		t.Fatal("a refused claim wrote a record")
	}
	res, err := s.Claim(ctx, held, newRecord(t), time.Minute, claim.Quota{})
	if err != nil || res.Claimed || res.Existing.Token != owner.Token || res.TTL <= 0 {
		t.Fatalf("claim of a held key while full = %+v, %v; want the owner's record with its lease", res, err)
	}
	if _, err := s.Complete(ctx, held, completed(owner, "done"), time.Hour); err != nil {
		t.Fatalf("completion while full: %v", err)
	}
	res, err = s.Claim(ctx, held, newRecord(t), time.Minute, claim.Quota{})
	if err != nil || res.Existing == nil || string(res.Existing.Body) != "done" {
		t.Fatalf("replay while full = %+v, %v", res, err)
	}
}

// A quota counts new keys only, shared through Redis, and a claim beyond
// it is undone.
func testQuota(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	q := claim.Quota{Key: s.QuotaKey("alice", "route"), Limit: 2, Window: time.Hour}
	first := newRecord(t)
	for i, k := range []string{"a", "b"} {
		rec := newRecord(t)
		if i == 0 {
			rec = first
		}
		if res, err := s.Claim(ctx, s.Key("alice", "route", k), rec, time.Minute, q); err != nil || !res.Claimed {
			t.Fatalf("new key %s: %+v, %v", k, res, err)
		}
	}
	// An existing key is answered from its record and does not count.
	if res, err := s.Claim(ctx, s.Key("alice", "route", "a"), newRecord(t), time.Minute, q); err != nil || res.Claimed || res.Existing.Token != first.Token {
		t.Fatalf("existing key: %+v, %v", res, err)
	}
	over := s.Key("alice", "route", "c")
	_, err := s.Claim(ctx, over, newRecord(t), time.Minute, q)
	qe, ok := errors.AsType[*claim.QuotaError](err)
	if !errors.Is(err, claim.ErrQuota) || !ok || qe.RetryAfter <= 0 || qe.RetryAfter > time.Hour {
		t.Fatalf("third new key: %v, want a QuotaError with the window's rest", err)
	}
	if got, _, _ := s.Get(ctx, over); got != nil {
		t.Fatal("the claim beyond the quota was not undone")
	}
	if res, err := s.Claim(ctx, s.Key("bob", "route", "c"), newRecord(t), time.Minute, claim.Quota{Key: s.QuotaKey("bob", "route"), Limit: 2, Window: time.Hour}); err != nil || !res.Claimed {
		t.Fatalf("another principal: %+v, %v", res, err)
	}
}

// testUnforwardedClaims: a claim marks its record with its lease; one
// whose SET ran more than ConfirmWindow + ClockSkew after its Created time
// (a reply that came too late: its owner never forwarded) is reported
// Unforwarded to the next claim, and ReleaseUnforwarded frees it, fenced:
// a fresh claim is not reported, a renewed one is not either, and one
// renewed since it was read is left alone.
func testUnforwardedClaims(t *testing.T, _ redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	s.CheckClocks(ctx) // what the store watcher does every second: claims are marked from now
	lease := 10 * time.Second
	keyFresh, keyGhost, keyRenewed, keyLost := s.Key("p", "s", "fresh"), s.Key("p", "s", "ghost"), s.Key("p", "s", "renewed"), s.Key("p", "s", "lost")
	other := newRecord(t)
	other.Created = time.Now()

	fresh := newRecord(t)
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

	ghost := newRecord(t)
	ghost.Created = time.Now().Add(-3 * time.Second) // its SET runs 3s after its owner sent it
	if err := s.PlantUnconfirmed(ctx, keyGhost, ghost, lease); err != nil {
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

	renewed := newRecord(t)
	renewed.Created = time.Now().Add(-3 * time.Second)
	if err := s.PlantUnconfirmed(ctx, keyRenewed, renewed, lease); err != nil {
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

	// A claim whose reply never came: ReleaseUnconfirmed frees it, and
	// says when there was nothing of ours.
	lost := newRecord(t)
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

// testUnforwardedReadersClock (issue 30): whether a claim was forwarded
// is decided on Redis' clock, never on the reader's. A reader whose reply
// arrives 2s late (its clock reads 2s on) still sees a claim that landed
// at once as forwarded; a claim that landed 3s after it was sent is seen
// as never forwarded by a reader whose clock is 2s behind. Before the fix
// the first read took time.Now() after the reply and freed the claim.
func testUnforwardedReadersClock(t *testing.T, c redis.UniversalClient, owner *claim.Store) {
	ctx := context.Background()
	lease := 10 * time.Second
	owner.CheckClocks(ctx)
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
			key := owner.Key("p", "clock", tc.name)
			rec := newRecord(t)
			rec.Created = time.Now().Add(-tc.late)
			// Planted: an owner that got this reply would have renewed a
			// claim that ran 3s late (forwardable) before forwarding it.
			if err := owner.PlantUnconfirmed(ctx, key, rec, lease); err != nil {
				t.Fatalf("claim: %v", err)
			}
			reader := claim.New(c, "", claim.WithPipeline(false))
			claim.SetClock(reader, func() time.Time { return time.Now().Add(tc.reader) })
			other := newRecord(t)
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
func testUnmarkedWhileClockOff(t *testing.T, c redis.UniversalClient, _ *claim.Store) {
	ctx := context.Background()
	var off atomic.Int64
	off.Store(int64(2 * time.Second))
	s := claim.New(c, "test:clockoff:")
	claim.SetClock(s, func() time.Time { return time.Now().Add(time.Duration(off.Load())) })
	s.CheckClocks(ctx)
	rec := newRecord(t)
	rec.Created = time.Now()
	key := s.Key("p", "s", "off")
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
		s.CheckClocks(ctx)
		n++
		key := s.Key("p", "s", fmt.Sprint("on-", n))
		on := newRecord(t)
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
func testOwnRoundTripDecides(t *testing.T, c redis.UniversalClient, _ *claim.Store) {
	ctx := context.Background()
	s := claim.New(c, fmt.Sprintf("test:own:%d:", time.Now().UnixNano()))
	s.CheckClocks(ctx)
	lease := 10 * time.Second
	onTime := newRecord(t)
	onTime.Created = time.Now()
	key := s.Key("p", "s", "on time")
	if res, err := s.Claim(ctx, key, onTime, lease, claim.Quota{}); err != nil || !res.Claimed || res.Renewed {
		t.Fatalf("a claim on time: %+v %v, want claimed as it is", res, err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkClaimed {
		t.Fatalf("a claim on time: %+v, want MarkClaimed", got)
	}

	late := newRecord(t)
	late.Created = time.Now().Add(-3 * time.Second)
	key = s.Key("p", "s", "late")
	res, err := s.Claim(ctx, key, late, lease, claim.Quota{Key: s.QuotaKey("p", "s"), Limit: 10, Window: time.Minute})
	if err != nil || !res.Claimed || !res.Renewed || late.Mark != claim.MarkRenewed {
		t.Fatalf("a claim whose SET ran 3s after Created: %+v %v (mark %d), want claimed and renewed", res, err, late.Mark)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkRenewed {
		t.Fatalf("its record: %+v, want MarkRenewed", got)
	}
	next := newRecord(t)
	next.Created = time.Now()
	nextKey := s.Key("p", "s", "next")
	if _, err := s.Claim(ctx, nextKey, next, lease, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, nextKey); got == nil || got.Mark != claim.MarkNone {
		t.Fatalf("the claim after: %+v, want MarkNone until the clocks are measured again", got)

	}
	other := newRecord(t)
	other.Created = time.Now()
	if res, err := s.Claim(ctx, key, other, lease, claim.Quota{}); err != nil || res.Claimed || res.Unforwarded {
		t.Fatalf("a retry: %+v %v, want the claim in progress, not Unforwarded", res, err)
	}
}

// testUnforwardedByScript: a claim that finds a ghost reads Redis' clock
// with the record in its own script, and concludes the same way, also
// when Redis lost its script cache.
func testUnforwardedByScript(t *testing.T, c redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	s.CheckClocks(ctx)
	key := s.Key("p", "script", "ghost")
	ghost := newRecord(t)
	ghost.Created = time.Now().Add(-3 * time.Second)
	if err := s.PlantUnconfirmed(ctx, key, ghost, 10*time.Second); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, key, newRecord(t), 10*time.Second, claim.Quota{})
	if err != nil || res.Claimed || !res.Unforwarded || res.TTL <= 0 {
		t.Fatalf("by script: %+v %v, want Unforwarded with a TTL", res, err)
	}
}

// testEpochMarkers (issue 33): the first look creates each master's
// epoch marker (no TTL) from Redis' clock, a new store's epoch, which
// refuses nothing (EpochStart zero); the next looks find the same epoch;
// once the marker is gone (the store lost its data), the next look begins
// an epoch after a loss, later than the first, reported Lost once, whose
// start EpochStart returns.
func testEpochMarkers(t *testing.T, c redis.UniversalClient, _ *claim.Store) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:epoch:%d:", time.Now().UnixNano())
	var mu sync.Mutex
	var seen []claim.Epoch
	s := claim.New(c, prefix, claim.WithEpochObserver(func(e claim.Epoch) { mu.Lock(); seen = append(seen, e); mu.Unlock() }))
	first, err := s.CheckEpochs(ctx)
	if err != nil || len(first) == 0 {
		t.Fatalf("first look: %v %v", first, err)
	}
	key := s.Key("p", "s", "k")
	if start, err := s.EpochStart(ctx, key); err != nil || !start.IsZero() || first[0].AfterLoss {
		t.Fatalf("a new store's epoch: start %v %v (%+v), want zero: nothing was lost", start, err, first[0])
	}
	again, _ := s.CheckEpochs(ctx)
	for i := range again {
		if again[i].Lost || !again[i].Start.Equal(first[i].Start) {
			t.Fatalf("a second look: %+v, want the same epoch %+v, not lost", again[i], first[i])
		}
	}
	time.Sleep(5 * time.Millisecond)
	// The store loses its data: every marker under the prefix goes.
	var cursorKeys []string
	scan := func(ctx context.Context, cl *redis.Client) error {
		iter := cl.Scan(ctx, 0, prefix+"epoch*", 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			cursorKeys = append(cursorKeys, iter.Val())
			mu.Unlock()
			cl.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, scan); err != nil {
			t.Fatal(err)
		}
	} else if err := scan(ctx, c.(*redis.Client)); err != nil {
		t.Fatal(err)
	}
	if len(cursorKeys) != len(first) {
		t.Fatalf("%d markers in Redis for %d masters: want one per master", len(cursorKeys), len(first))
	}
	after, err := s.CheckEpochs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		if !after[i].Lost || !after[i].AfterLoss || !after[i].Start.After(first[i].Start) {
			t.Errorf("after the loss: %+v, want Lost, AfterLoss and a later start than %v", after[i], first[i].Start)
		}
	}
	if latest, _ := s.EpochStart(ctx, key); latest.IsZero() || time.Since(latest) > time.Minute {
		t.Errorf("EpochStart after the loss: %v, want about now", latest)
	}
	// A marker recreated by a process that never saw the old one says
	// "new store"; this process knew better and marks it, so that a
	// process that starts now takes it for an epoch after a loss too.
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.ForEachMaster(ctx, scan)
	} else {
		scan(ctx, c.(*redis.Client))
	}
	ignorant := claim.New(c, prefix)
	if _, err := ignorant.CheckEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := ignorant.EpochStart(ctx, key); !got.IsZero() {
		t.Fatalf("a process that never saw a marker takes a missing one for a new store's: got %v", got)
	}
	if again, _ := s.CheckEpochs(ctx); len(again) == 0 || !again[0].Lost || !again[0].AfterLoss {
		t.Fatalf("the process that knew the old epoch: %+v, want Lost and AfterLoss", again)
	}
	if got, _ := claim.New(c, prefix).EpochStart(ctx, key); got.IsZero() {
		t.Error("after the marker was marked, a new process does not see the epoch after a loss")
	}
	// Another process, which never saw the old marker, reads the same
	// epoch after the loss.
	other := claim.New(c, prefix)
	if got, _ := other.EpochStart(ctx, key); got.IsZero() {
		t.Error("a process that starts after the loss does not see the epoch after it")
	}
	if later, _ := s.CheckEpochs(ctx); len(later) > 0 && later[0].Lost {
		t.Error("the same loss reported twice")
	}
}

// testCompressedRecords (issue 35): a store that compresses writes a
// JSON answer's body zstd-compressed (smaller in Redis, flagged), and it,
// and a store that does not compress, read the same answer back byte for
// byte; a small body, or one with a Content-Encoding, is stored as it is.
func testCompressedRecords(t *testing.T, c redis.UniversalClient, plain *claim.Store) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:zstd:%d:", time.Now().UnixNano())
	z := claim.New(c, prefix, claim.WithCompression())
	reader := claim.New(c, prefix)
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
			key := z.Key("p", "zstd", tc.name)
			rec := newRecord(t)
			if _, err := z.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
				t.Fatal(err)
			}
			done := completed(rec, string(tc.body))
			if tc.encoding != "" {
				done.Header = http.Header{"Content-Encoding": {tc.encoding}}
			}
			if _, err := z.Complete(ctx, key, done, time.Hour); err != nil {
				t.Fatal(err)
			}
			raw, err := c.Get(ctx, key).Bytes()
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
			for name, s := range map[string]*claim.Store{"the compressing store": z, "a store that does not compress": reader} {
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
func testKeyedFingerprints(t *testing.T, c redis.UniversalClient, s *claim.Store) {
	ctx := context.Background()
	secret := bytes.Repeat([]byte{3}, 32)
	prefix := "kf:" + s.Key("", "", "")[:12] + ":"
	v1 := claim.New(c, prefix, claim.WithKeyedFingerprints(secret, false))
	v2 := claim.New(c, prefix, claim.WithKeyedFingerprints(secret, true))
	plain := claim.New(c, prefix)
	defer v1.Close()
	defer v2.Close()
	defer plain.Close()
	fp := claim.Fingerprint{1, 2, 3}
	other := claim.Fingerprint{9}

	old := newRecord(t)
	old.Fingerprint = fp
	k1 := v1.Key("p", "s", "format-1")
	if res, err := v1.Claim(ctx, k1, old, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	got, _, err := v2.Get(ctx, k1)
	if err != nil || got.KeyedFingerprint || !v2.SameRequest(got, fp) || v2.SameRequest(got, other) {
		t.Fatalf("a format-1 record read under format 2: %+v %v", got, err)
	}

	rec := newRecord(t)
	rec.Fingerprint = fp
	k2 := v2.Key("p", "s", "format-2")
	if res, err := v2.Claim(ctx, k2, rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if _, err := v2.Complete(ctx, k2, completed(rec, "ok"), time.Minute); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Get(ctx, k2).Bytes()
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
	for name, st := range map[string]*claim.Store{"format 2": v2, "format 1 with the secret": v1} {
		if !st.SameRequest(stored, fp) || st.SameRequest(stored, other) {
			t.Errorf("%s: a keyed record does not compare as the request it was written for", name)
		}
	}
	if plain.SameRequest(stored, fp) {
		t.Error("a store without the secret matched a keyed fingerprint")
	}
}

// Compact records (store.record_format: 3) on every deployment: written
// compact, read back equal by a store that does not write them (a
// replica still on format 1 of this release), fenced by the scripts as
// the fixed layout is (a resent completion is ours; another owner's is
// refused; forget by state works), and a sealing store keeps the fixed
// layout, whose header is the sealing's additional data.
func testCompactRecords(t *testing.T, c redis.UniversalClient, _ *claim.Store) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:compact:%d:", time.Now().UnixNano())
	compact := claim.New(c, prefix, claim.WithCompactRecords())
	reader := claim.New(c, prefix)
	key := compact.Key("alice", "route", "k1")
	rec := newRecord(t)
	if _, err := compact.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	done := completed(rec, `{"id":"ch_1"}`)
	done.RequestID = "0123456789abcdef0123456789abcdef"
	done.Header.Set("Date", "Tue, 01 Dec 2026 18:00:00 GMT")
	done.Header.Set("Content-Length", "13")
	if _, err := compact.Complete(ctx, key, done, time.Hour); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Get(ctx, key).Bytes()
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
	if n, _ := c.Exists(ctx, key).Result(); n != 0 {
		t.Error("the forgotten compact record is still there")
	}

	sealing, err := claim.WithSealing([][]byte{newKey(t)}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	sealedCompact := claim.New(c, prefix+"sealed:", sealing, claim.WithCompactRecords())
	key = sealedCompact.Key("alice", "route", "k2")
	rec = newRecord(t)
	if _, err := sealedCompact.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sealedCompact.Complete(ctx, key, completed(rec, `{"card":"secret"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _, err := sealedCompact.Get(ctx, key); err != nil || got == nil || string(got.Body) != `{"card":"secret"}` || got.Compact {
		t.Fatalf("a sealed record under record_format 3: %+v, %v; want it sealed in the fixed layout and read back", got, err)
	}
}
