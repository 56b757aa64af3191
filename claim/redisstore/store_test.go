package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// backend is one store deployment the contract suite runs against. setup
// starts it once; every test then gets its own key prefix on it.
type backend struct {
	name  string
	setup func(t *testing.T) redis.UniversalClient
}

func clientFor(t *testing.T, cfg redisstore.ClientOptions) redis.UniversalClient {
	c, _ := redisstore.NewClient(cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

var backends = []backend{
	{"embedded", func(t *testing.T) redis.UniversalClient {
		e, err := redisstore.StartEmbedded()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		return clientFor(t, redisstore.ClientOptions{Addrs: []string{e.Addr()}})
	}},
	{"redis-server", func(t *testing.T) redis.UniversalClient {
		return clientFor(t, redisstore.ClientOptions{Addrs: []string{redistest.Start(t).Addr}})
	}},
	// Every operation touches one key, so on a Cluster each is served by
	// the key's slot owner; a cross-slot operation would fail here.
	{"cluster", func(t *testing.T) redis.UniversalClient {
		return clientFor(t, redisstore.ClientOptions{Addrs: redistest.StartCluster(t, 3, 1).Addrs()})
	}},
	{"sentinel", func(t *testing.T) redis.UniversalClient {
		s := redistest.StartSentinel(t, 1)
		return clientFor(t, redisstore.ClientOptions{Addrs: s.SentinelAddrs(), MasterName: s.MasterName})
	}},
}

// TestContract runs the shared contract suite (claim/contract) against
// the embedded store, a real redis-server, a 3-master Cluster with
// replicas and a Sentinel-managed master, with operations coalesced into
// pipelines (the default) and sent one by one (store.pipeline: false):
// the same behaviour is required of all.
func TestContract(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			c := b.setup(t)
			for _, pipelined := range []bool{true, false} {
				mode := map[bool]string{true: "pipelined", false: "direct"}[pipelined]
				t.Run(mode, func(t *testing.T) {
					contract.Run(t, func(t *testing.T, prefix string, opts ...claim.Option) claim.Backend {
						return redisstore.New(c, prefix, append(opts, claim.WithPipeline(pipelined))...)
					})
				})
			}
		})
	}
}

// TestRedisContract runs the cases that need Redis itself (its raw
// values, its script cache, its clock through SetClock, its topology)
// against the same deployments: the Redis-only part of the contract.
func TestRedisContract(t *testing.T) {
	tests := []struct {
		name string
		fn   func(t *testing.T, c redis.UniversalClient, s *redisstore.Store)
	}{
		{"ForeignValueNeverTouched", testForeignValue},
		{"SealedRecords", testSealedRecords},
		{"KeyRotation", testKeyRotation},
		{"SecretKeyDerivation", testSecretKeyDerivation},
		{"SealingRequired", testSealingRequired},
		{"UnforwardedWhateverTheReadersClock", testUnforwardedReadersClock},
		{"UnmarkedWhileTheClockIsOff", testUnmarkedWhileClockOff},
		{"UnforwardedByScript", testUnforwardedByScript},
		{"OwnRoundTripDecides", testOwnRoundTripDecides},
		{"EpochMarkers", testEpochMarkers},
		{"CompressedRecords", testCompressedRecords},
		{"CompactRecords", testCompactRecords},
		{"KeyedFingerprints", testKeyedFingerprints},
		{"TakeOverFencedOnExpiry", testTakeOverFencedOnExpiry},
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
						tt.fn(t, c, redisstore.New(c, "test:"+mode.name+":"+tt.name+":", claim.WithPipeline(mode.pipelined)))
					})
				}
			}
		})
	}
}

// waitClaimed claims key for rec, retrying until an earlier lease lapses.
func testForeignValue(t *testing.T, c redis.UniversalClient, s *redisstore.Store) {
	ctx := context.Background()
	key := s.Codec().Key("alice", "route", "k1")
	foreign := "\x01\x01\x00not a record of ours at all, but with our version byte"
	for _, v := range []string{"hello", foreign, ""} {
		if err := c.Set(ctx, key, v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		rec := contract.NewRecord(t)
		if _, err := s.Claim(ctx, key, rec, time.Second, claim.Quota{}); !errors.Is(err, claim.ErrCorrupt) {
			t.Errorf("claim over %q = %v, want ErrCorrupt", v, err)
		}
		if _, err := s.Complete(ctx, key, contract.Completed(rec, "x"), time.Hour); !errors.Is(err, claim.ErrLeaseLost) {
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

func TestKeyFramingAndPrivacy(t *testing.T) {
	s := redisstore.New(nil, "idem:")
	a := s.Codec().Key("ab", "route", "c")
	b := s.Codec().Key("a", "route", "bc")
	if a == b {
		t.Fatal("(ab, c) and (a, bc) share a key: inputs are not framed")
	}
	if s.Codec().Key("alice", "r1", "k") == s.Codec().Key("alice", "r2", "k") {
		t.Error("scope does not separate keys")
	}
	if s.Codec().Key("alice", "r", "k") == s.Codec().Key("bob", "r", "k") {
		t.Error("principal does not separate keys")
	}
	k := s.Codec().Key("alice", "route", "secret-key")
	if !strings.HasPrefix(k, "idem:") || len(k) != len("idem:")+64 || strings.Contains(k, "alice") || strings.Contains(k, "secret") {
		t.Errorf("key %q must be the prefix and a hex SHA-256, nothing raw", k)
	}
}

func TestStoreUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	c, _ := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{srv.Addr}})
	defer c.Close()
	s := redisstore.New(c, "test:")
	srv.Stop()
	_, err := s.Claim(context.Background(), s.Codec().Key("a", "r", "k"), contract.NewRecord(t), time.Second, claim.Quota{})
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("claim with Redis down = %v, want ErrUnavailable", err)
	}
	if err := s.Ping(context.Background()); !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("ping with Redis down = %v, want ErrUnavailable", err)
	}
}

// testUnforwardedReadersClock (issue 30): whether a claim was forwarded
// is decided on Redis' clock, never on the reader's. A reader whose reply
// arrives 2s late (its clock reads 2s on) still sees a claim that landed
// at once as forwarded; a claim that landed 3s after it was sent is seen
// as never forwarded by a reader whose clock is 2s behind. Before the fix
// the first read took time.Now() after the reply and freed the claim.
func testUnforwardedReadersClock(t *testing.T, c redis.UniversalClient, owner *redisstore.Store) {
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
			key := owner.Codec().Key("p", "clock", tc.name)
			rec := contract.NewRecord(t)
			rec.Created = time.Now().Add(-tc.late)
			// Planted: an owner that got this reply would have renewed a
			// claim that ran 3s late (Forwardable) before forwarding it.
			if err := owner.PlantUnconfirmed(ctx, key, rec, lease); err != nil {
				t.Fatalf("claim: %v", err)
			}
			reader := redisstore.New(c, "", claim.WithPipeline(false))
			redisstore.SetClock(reader, func() time.Time { return time.Now().Add(tc.reader) })
			other := contract.NewRecord(t)
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
func testUnmarkedWhileClockOff(t *testing.T, c redis.UniversalClient, _ *redisstore.Store) {
	ctx := context.Background()
	var off atomic.Int64
	off.Store(int64(2 * time.Second))
	s := redisstore.New(c, "test:clockoff:")
	redisstore.SetClock(s, func() time.Time { return time.Now().Add(time.Duration(off.Load())) })
	s.CheckClocks(ctx)
	rec := contract.NewRecord(t)
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
		s.CheckClocks(ctx)
		n++
		key := s.Codec().Key("p", "s", fmt.Sprint("on-", n))
		on := contract.NewRecord(t)
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
func testOwnRoundTripDecides(t *testing.T, c redis.UniversalClient, _ *redisstore.Store) {
	ctx := context.Background()
	s := redisstore.New(c, fmt.Sprintf("test:own:%d:", time.Now().UnixNano()))
	s.CheckClocks(ctx)
	lease := 10 * time.Second
	onTime := contract.NewRecord(t)
	onTime.Created = time.Now()
	key := s.Codec().Key("p", "s", "on time")
	if res, err := s.Claim(ctx, key, onTime, lease, claim.Quota{}); err != nil || !res.Claimed || res.Renewed {
		t.Fatalf("a claim on time: %+v %v, want claimed as it is", res, err)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkClaimed {
		t.Fatalf("a claim on time: %+v, want MarkClaimed", got)
	}

	late := contract.NewRecord(t)
	late.Created = time.Now().Add(-3 * time.Second)
	key = s.Codec().Key("p", "s", "late")
	res, err := s.Claim(ctx, key, late, lease, claim.Quota{Key: s.Codec().QuotaKey("p", "s"), Limit: 10, Window: time.Minute})
	if err != nil || !res.Claimed || !res.Renewed || late.Mark != claim.MarkRenewed {
		t.Fatalf("a claim whose SET ran 3s after Created: %+v %v (mark %d), want claimed and renewed", res, err, late.Mark)
	}
	if got, _, _ := s.Get(ctx, key); got == nil || got.Mark != claim.MarkRenewed {
		t.Fatalf("its record: %+v, want MarkRenewed", got)
	}
	next := contract.NewRecord(t)
	next.Created = time.Now()
	nextKey := s.Codec().Key("p", "s", "next")
	if _, err := s.Claim(ctx, nextKey, next, lease, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Get(ctx, nextKey); got == nil || got.Mark != claim.MarkNone {
		t.Fatalf("the claim after: %+v, want MarkNone until the clocks are measured again", got)

	}
	other := contract.NewRecord(t)
	other.Created = time.Now()
	if res, err := s.Claim(ctx, key, other, lease, claim.Quota{}); err != nil || res.Claimed || res.Unforwarded {
		t.Fatalf("a retry: %+v %v, want the claim in progress, not Unforwarded", res, err)
	}
}

// testUnforwardedByScript: a claim that finds a ghost reads Redis' clock
// with the record in its own script, and concludes the same way, also
// when Redis lost its script cache.
func testUnforwardedByScript(t *testing.T, c redis.UniversalClient, s *redisstore.Store) {
	ctx := context.Background()
	s.CheckClocks(ctx)
	key := s.Codec().Key("p", "script", "ghost")
	ghost := contract.NewRecord(t)
	ghost.Created = time.Now().Add(-3 * time.Second)
	if err := s.PlantUnconfirmed(ctx, key, ghost, 10*time.Second); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, key, contract.NewRecord(t), 10*time.Second, claim.Quota{})
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
func testEpochMarkers(t *testing.T, c redis.UniversalClient, _ *redisstore.Store) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:epoch:%d:", time.Now().UnixNano())
	var mu sync.Mutex
	var seen []claim.Epoch
	s := redisstore.New(c, prefix, claim.WithEpochObserver(func(e claim.Epoch) { mu.Lock(); seen = append(seen, e); mu.Unlock() }))
	first, err := s.CheckEpochs(ctx)
	if err != nil || len(first) == 0 {
		t.Fatalf("first look: %v %v", first, err)
	}
	key := s.Codec().Key("p", "s", "k")
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
	ignorant := redisstore.New(c, prefix)
	if _, err := ignorant.CheckEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := ignorant.EpochStart(ctx, key); !got.IsZero() {
		t.Fatalf("a process that never saw a marker takes a missing one for a new store's: got %v", got)
	}
	if again, _ := s.CheckEpochs(ctx); len(again) == 0 || !again[0].Lost || !again[0].AfterLoss {
		t.Fatalf("the process that knew the old epoch: %+v, want Lost and AfterLoss", again)
	}
	if got, _ := redisstore.New(c, prefix).EpochStart(ctx, key); got.IsZero() {
		t.Error("after the marker was marked, a new process does not see the epoch after a loss")
	}
	// Another process, which never saw the old marker, reads the same
	// epoch after the loss.
	other := redisstore.New(c, prefix)
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
func testCompressedRecords(t *testing.T, c redis.UniversalClient, plain *redisstore.Store) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:zstd:%d:", time.Now().UnixNano())
	z := redisstore.New(c, prefix, claim.WithCompression())
	reader := redisstore.New(c, prefix)
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
			rec := contract.NewRecord(t)
			if _, err := z.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
				t.Fatal(err)
			}
			done := contract.Completed(rec, string(tc.body))
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
			for name, s := range map[string]*redisstore.Store{"the compressing store": z, "a store that does not compress": reader} {
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
func testKeyedFingerprints(t *testing.T, c redis.UniversalClient, s *redisstore.Store) {
	ctx := context.Background()
	secret := bytes.Repeat([]byte{3}, 32)
	prefix := "kf:" + s.Codec().Key("", "", "")[:12] + ":"
	v1 := redisstore.New(c, prefix, claim.WithKeyedFingerprints(secret, false))
	v2 := redisstore.New(c, prefix, claim.WithKeyedFingerprints(secret, true))
	plain := redisstore.New(c, prefix)
	defer v1.Close()
	defer v2.Close()
	defer plain.Close()
	fp := claim.Fingerprint{1, 2, 3}
	other := claim.Fingerprint{9}

	old := contract.NewRecord(t)
	old.Fingerprint = fp
	k1 := v1.Codec().Key("p", "s", "format-1")
	if res, err := v1.Claim(ctx, k1, old, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	got, _, err := v2.Get(ctx, k1)
	if err != nil || got.KeyedFingerprint || !v2.Codec().SameRequest(got, fp) || v2.Codec().SameRequest(got, other) {
		t.Fatalf("a format-1 record read under format 2: %+v %v", got, err)
	}

	rec := contract.NewRecord(t)
	rec.Fingerprint = fp
	k2 := v2.Codec().Key("p", "s", "format-2")
	if res, err := v2.Claim(ctx, k2, rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if _, err := v2.Complete(ctx, k2, contract.Completed(rec, "ok"), time.Minute); err != nil {
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
	for name, st := range map[string]*redisstore.Store{"format 2": v2, "format 1 with the secret": v1} {
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
func testCompactRecords(t *testing.T, c redis.UniversalClient, _ *redisstore.Store) {
	ctx := context.Background()
	prefix := fmt.Sprintf("test:compact:%d:", time.Now().UnixNano())
	compact := redisstore.New(c, prefix, claim.WithCompactRecords())
	reader := redisstore.New(c, prefix)
	key := compact.Codec().Key("alice", "route", "k1")
	rec := contract.NewRecord(t)
	if _, err := compact.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	done := contract.Completed(rec, `{"id":"ch_1"}`)
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
	sealedCompact := redisstore.New(c, prefix+"sealed:", sealing, claim.WithCompactRecords())
	key = sealedCompact.Codec().Key("alice", "route", "k2")
	rec = contract.NewRecord(t)
	if _, err := sealedCompact.Claim(ctx, key, rec, 10*time.Second, claim.Quota{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sealedCompact.Complete(ctx, key, contract.Completed(rec, `{"card":"secret"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _, err := sealedCompact.Get(ctx, key); err != nil || got == nil || string(got.Body) != `{"card":"secret"}` || got.Compact {
		t.Fatalf("a sealed record under record_format 3: %+v, %v; want it sealed in the fixed layout and read back", got, err)
	}
}

// TestSpansNameTheCommand: a store span is named after the Redis command
// its operation sends (a read GET, the claim and every fenced write a
// script), and carries db.system.name, db.operation.name and the server
// NameServer gave.
func TestSpansNameTheCommand(t *testing.T) {
	s := redisstore.New(nil, "idem:")
	s.NameServer("10.0.0.7:6380")
	for op, want := range map[string]string{"get": "GET", "claim": "EVALSHA", "epoch": "EVALSHA", "stream_read": "EVALSHA"} {
		d := s.Span(op)
		attrs := map[string]string{}
		for _, a := range d.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		if d.Name != want || attrs["db.operation.name"] != want || attrs["db.system.name"] != "redis" || attrs["server.address"] != "10.0.0.7" || attrs["server.port"] != "6380" {
			t.Errorf("%s: span %q with %v, want %s on redis at 10.0.0.7:6380", op, d.Name, attrs, want)
		}
	}
}
