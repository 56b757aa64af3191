// Package redisstore is the Redis backend of claim: claims and settled
// responses in Redis (one server, Sentinel or Cluster), or in the
// embedded store. It is the only package that talks to Redis.
//
// It is not a library: its exported names serve the idemproxy binary and
// the repository's tests and harnesses, and change between releases
// without notice. The stored formats are kept (every release reads the
// formats before it, CHANGELOG.md), not the Go API; a Store comes from New.
//
// Every write touches exactly one key in one atomic command, a Lua script
// (the claim reads the key's PTTL and Redis' clock in the same script). So
// each works on Redis Cluster and is safe when go-redis
// resends a command after a lost reply: a resent claim finds our own token
// and a resent completion finds our own completed record, and both count
// as success.
package redisstore

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemproxy/idemproxy/claim"
)

// Store keeps claims in Redis.
type Store struct {
	client redis.UniversalClient
	// codec derives keys and writes and reads records (claim.Codec).
	codec  *claim.Codec
	prefix string
	// full refuses new claims (SetFull).
	full atomic.Bool

	// watch wakes waiters (watch.go).
	watch *watcher
	// batch coalesces concurrent operations into pipelines (batch.go);
	// nil sends each operation on its own.
	batch *batcher

	// waitReplicas > 0 sends WAIT after claims and completions.
	waitReplicas int
	waitTimeout  time.Duration
	onWaitShort  func(op string)

	// masterName, on Sentinel, names the master for Health.
	masterName string

	// clocks is what the clock measurements said (claim.Clocks,
	// clock.go).
	clocks *claim.Clocks
	// streamLimit is the longest streamed record a claim reads back (0:
	// any); claim.WithStreamReadLimit.
	streamLimit int

	// dials counts the connections this store's client made, dialErr
	// holds the last attempt that failed since one succeeded (sent.go).
	dials   atomic.Uint64
	dialErr atomic.Pointer[failedDial]
	// epochs are the masters' epochs (epoch.go).
	epochs epochState
	// spanAttrs are every store span's attributes (Span).
	spanAttrs []attribute.KeyValue
}

var _ claim.Backend = (*Store)(nil)

// New returns a Store using client, with every key under prefix.
// Concurrent operations are coalesced into pipelines (claim.WithPipeline)
// unless claim.WithWait is given: WAIT blocks its connection, and would
// hold up every operation behind it in a batch.
func New(client redis.UniversalClient, prefix string, opts ...claim.Option) *Store {
	codec, o := claim.Build(prefix, opts...)
	s := &Store{client: client, codec: codec, prefix: prefix, watch: newWatcher(client), streamLimit: codec.StreamReadLimit()}
	s.waitReplicas, s.waitTimeout, s.onWaitShort = o.WaitReplicas, o.WaitTimeout, o.OnWaitShort
	s.epochs.onLoss, s.masterName = o.OnEpoch, o.NodeName
	s.clocks = claim.NewClocks(o.Now, s.CheckClocks)
	if o.Pipeline && s.waitReplicas == 0 {
		s.batch = newBatcher(client, o.OnBatch)
	}
	s.countDials()
	// db.namespace: idemproxy's keys live in database 0, the only one a
	// Cluster has (the database semantic conventions name it by index).
	s.spanAttrs = []attribute.KeyValue{semconv.DBSystemNameRedis, semconv.DBNamespace("0")}
	return s
}

// NameServer has the store's spans name addr (host:port, the first
// configured Redis address) as server.address and server.port.
func (s *Store) NameServer(addr string) {
	s.spanAttrs = append(s.spanAttrs[:2:2], hostPort(addr)...)
}

// Codec is the store's claim.Codec: its keys and record bytes.
func (s *Store) Codec() *claim.Codec { return s.codec }

// storeCommands are the Redis command each store operation (its metric
// label) sends, which names its span: a read is GET, the claim and every
// fenced write a Lua script.
var storeCommands = map[string]string{"get": "GET"}

// Span describes store operation op's client span: named after the Redis
// command it sends.
func (s *Store) Span(op string) claim.Span {
	cmd, ok := storeCommands[op]
	if !ok {
		cmd = "EVALSHA"
	}
	return claim.Span{Name: cmd, Attributes: append(s.spanAttrs[:len(s.spanAttrs):len(s.spanAttrs)], semconv.DBOperationName(cmd))}
}

// hostPort is server.address and server.port for addr (host or
// host:port).
func hostPort(addr string) []attribute.KeyValue {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, ""
	}
	out := []attribute.KeyValue{semconv.ServerAddress(host)}
	if n, err := strconv.Atoi(port); err == nil {
		out = append(out, semconv.ServerPort(n))
	}
	return out
}

// exec runs cmds, one operation's commands, in order, coalesced with other
// operations when that is on; size is about the bytes they carry. An
// error is ctx's: then cmds hold no result and must not be read.
func (s *Store) exec(ctx context.Context, size int, cmds ...redis.Cmder) error {
	if s.batch != nil {
		return s.batch.do(ctx, size, cmds...)
	}
	if len(cmds) == 1 {
		_ = s.client.Process(ctx, cmds[0])
		return nil
	}
	pipe := s.client.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...)
	_, _ = pipe.Exec(ctx)
	return nil
}

// eval runs script on key by its SHA, and by its source when Redis does
// not have it cached (a restart, a failover), as redis.Script.Run does.
func (s *Store) eval(ctx context.Context, script *redis.Script, key string, size int, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, append([]any{"evalsha", script.Hash(), 1, key}, args...)...)
	if err := s.exec(ctx, size, cmd); err != nil {
		return redis.NewCmdResult(nil, err)
	}
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") { // HasErrorPrefix allocates
		return script.Eval(ctx, s.client, []string{key}, args...)
	}
	return cmd
}

// Since is when this store first saw name: now, the first time any
// process asks, kept in "<prefix>since:<name>" without a TTL, like the
// epoch markers (a store that loses its data forgets it, with all it
// dated). A change of key derivation uses it to read the keys of the
// release before it for one retention, and then no more.
func (s *Store) Since(ctx context.Context, name string, now time.Time) (time.Time, error) {
	key := s.prefix + "since:" + name
	set := redis.NewBoolCmd(ctx, "set", key, now.UnixMilli(), "nx")
	get := redis.NewStringCmd(ctx, "get", key)
	if err := s.exec(ctx, 0, set, get); err != nil {
		return time.Time{}, s.unavailable("since", err)
	}
	ms, err := get.Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("claim: marker %s: %w", key, err)
	}
	return time.UnixMilli(ms), nil
}

// Close closes the store's subscriptions (Watch); the client stays open.
func (s *Store) Close() {
	s.watch.close()
}

// Ping reports whether Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return s.unavailable("ping", err)
	}
	return nil
}

// Preload loads the scripts into Redis' script cache, so the first requests
// run them by SHA instead of sending their source.
func (s *Store) Preload(ctx context.Context) error {
	for _, sc := range scripts {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return s.unavailable("script load", err)
		}
	}
	return nil
}

// EvictionPolicy returns Redis' maxmemory-policy. Any policy but
// noeviction can evict idempotency keys, since every key here has a TTL.
func (s *Store) EvictionPolicy(ctx context.Context) (string, error) {
	v, err := s.client.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return "", s.unavailable("config get", err)
	}
	return v["maxmemory-policy"], nil
}

// unavailable wraps a Redis failure. On a Cluster it also asks go-redis to
// reload the slot map: go-redis reloads it on MOVED, but not when a dead
// master refuses connections, and otherwise keeps sending that shard's keys
// to the dead node until its periodic reload (60 s), long after a replica
// took over.
func (s *Store) unavailable(op string, err error) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
	return claim.Unavailable(op, s.whyNoConnection(err))
}

// Records calls f with every record under the store's prefix: its key,
// its raw value, what is left of its key's life and Redis' clock (Unix
// ms), all read in one MULTI: what idemproxy store copy carries to another
// store (claim.CarryValue says how). Markers and quota counters are not
// records. A scan: for that command only, never on a request's path.
func (s *Store) Records(ctx context.Context, f func(key string, value []byte, ttl time.Duration, nowMS int64) error) error {
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, s.prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			if len(key)-len(s.prefix) != 64 { // markers (epoch, since:), quota counters (q:)
				continue
			}
			var get *redis.StringCmd
			var pttl *redis.DurationCmd
			var now *redis.TimeCmd
			_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				get, pttl, now = p.Get(ctx, key), p.PTTL(ctx, key), p.Time(ctx)
				return nil
			})
			v, gerr := get.Bytes()
			if gerr == redis.Nil || pttl.Val() <= 0 {
				continue // gone between the scan and the read
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", key, err)
			}
			if err := f(key, v, pttl.Val(), now.Val().UnixMilli()); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
	case *redis.Client:
		return scan(ctx, c)
	}
	return fmt.Errorf("claim: store copy: unsupported client %T", s.client)
}
