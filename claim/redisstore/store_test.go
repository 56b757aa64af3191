package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
			t.Parallel() // each deployment on servers of its own
			c := b.setup(t)
			for _, pipelined := range []bool{true, false} {
				mode := map[bool]string{true: "pipelined", false: "direct"}[pipelined]
				t.Run(mode, func(t *testing.T) {
					contract.Run(t, deployment{c: c, pipelined: pipelined})
				})
			}
		})
	}
}

// deployment is a Redis deployment as the contract suite sees it:
// stores on one client, its values read and written with GET and SET.
type deployment struct {
	c         redis.UniversalClient
	pipelined bool
}

func (d deployment) Open(t *testing.T, prefix string, opts ...claim.Option) claim.Backend {
	s := redisstore.New(d.c, prefix, append([]claim.Option{claim.WithPipeline(d.pipelined)}, opts...)...)
	t.Cleanup(s.Close)
	return s
}

func (d deployment) Raw(ctx context.Context, key string) ([]byte, error) {
	b, err := d.c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return b, err
}

func (d deployment) Plant(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return d.c.Set(ctx, key, value, ttl).Err()
}

func (d deployment) Lose(ctx context.Context, prefix string) error {
	lose := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if cc, ok := d.c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return lose(ctx, c) })
	}
	return lose(ctx, d.c)
}

// TestRedisContract runs the cases that are about Redis itself (its
// script cache, its epoch markers on each master) against the same
// deployments, one at a time (one flushes the server's script cache):
// the Redis-only part of the contract.
func TestRedisContract(t *testing.T) {
	tests := []struct {
		name string
		fn   func(t *testing.T, c redis.UniversalClient, s *redisstore.Store)
	}{
		{"UnforwardedByScript", testUnforwardedByScript},
		{"EpochMarkers", testEpochMarkers},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel() // each deployment on servers of its own
			c := b.setup(t)
			// Every test runs with operations coalesced into pipelines (the
			// default) and sent one by one (store.pipeline: false).
			for _, mode := range []struct {
				name      string
				pipelined bool
			}{{"pipelined", true}, {"direct", false}} {
				for _, tt := range tests {
					t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
						tt.fn(t, c, redisstore.New(c, "test:"+mode.name+":"+tt.name+":", claim.WithPipeline(mode.pipelined)))
					})
				}
			}
		})
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
	t.Parallel() // on servers of its own
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
