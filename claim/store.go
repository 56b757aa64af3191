// Package claim stores idempotency claims and settled responses in Redis.
// It is the only package that talks to Redis.
//
// Every write touches exactly one key in one atomic command: the claim is
// one native SET NX PX GET (followed by a PTTL read only when it finds
// another attempt in progress, for Retry-After), the others are Lua
// scripts. So each works on Redis Cluster and is safe when go-redis
// resends a command after a lost reply: a resent claim finds our own token
// and a resent completion finds our own completed record, and both count
// as success.
package claim

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors returned by Store. Callers test them with errors.Is.
var (
	// ErrLeaseLost means the key is no longer ours: the lease lapsed and
	// another attempt claimed it. The operation wrote nothing.
	ErrLeaseLost = errors.New("claim: lease lost to another owner")
	// ErrUnavailable wraps every failure to reach or use Redis.
	ErrUnavailable = errors.New("claim: store unavailable")
)

// Store keeps claims in Redis.
type Store struct {
	client redis.UniversalClient
	prefix string
	// scriptClaim is set once Redis refused SET NX GET (Redis < 7.0).
	scriptClaim atomic.Bool
	// full refuses new claims (SetFull).
	full atomic.Bool

	// seal, when set, seals records and opens sealed ones; keyMAC, when
	// set, keys the Redis key derivation.
	seal   *sealer
	keyMAC []byte

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
}

// writePipeline returns a pipeline on which a write to key and the WAIT
// after it share one connection, as WAIT counts only the writes made on
// its own connection: on a Cluster the pipeline of the key's master (the
// Cluster client would send a keyless WAIT to any node), elsewhere the
// client's.
func (s *Store) writePipeline(ctx context.Context, key string) (redis.Pipeliner, error) {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Pipeline(), nil
	}
	return s.client.Pipeline(), nil
}

// wait queues a WAIT on pipe, after the write it follows, when enabled.
func (s *Store) wait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	if s.waitReplicas <= 0 {
		return nil
	}
	return pipe.Do(ctx, "WAIT", s.waitReplicas, s.waitTimeout.Milliseconds())
}

// checkWait reports a WAIT that fewer replicas than asked acknowledged.
func (s *Store) checkWait(op string, cmd *redis.Cmd) {
	if cmd == nil {
		return
	}
	if n, err := cmd.Int(); (err != nil || n < s.waitReplicas) && s.onWaitShort != nil {
		s.onWaitShort(op)
	}
}

// New returns a Store using client, with every key under prefix.
// Concurrent operations are coalesced into pipelines (WithPipeline) unless
// WithWait is given: WAIT blocks its connection, and would hold up every
// operation behind it in a batch.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Store {
	s := &Store{client: client, prefix: prefix, batch: &batcher{client: client}, watch: newWatcher(client)}
	for _, o := range opts {
		o(s)
	}
	if s.waitReplicas > 0 {
		s.batch = nil
	}
	return s
}

// WithPipeline turns the coalescing of concurrent operations into
// pipelines on (the default) or off.
func WithPipeline(on bool) Option {
	return func(s *Store) {
		s.batch = nil
		if on {
			s.batch = &batcher{client: s.client}
		}
	}
}

// WithBatchObserver has observe called with the number of operations in
// every pipeline the store sends (when coalescing is on).
func WithBatchObserver(observe func(ops int)) Option {
	return func(s *Store) {
		if s.batch != nil {
			s.batch.onBatch = observe
		}
	}
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
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return script.Eval(ctx, s.client, []string{key}, args...)
	}
	return cmd
}

// valuePool holds the buffers completed records are encoded into: they
// hold the whole answer, and live only until Redis has them.
var valuePool = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledValue bounds the buffers kept: a rare large answer is not held
// for the next.
const maxPooledValue = 64 << 10

// setNXGet is the claim command: SET key value NX PX ttl GET.
func setNXGet(ctx context.Context, key string, value []byte, ttl time.Duration) *redis.StringCmd {
	return redis.NewStringCmd(ctx, "set", key, value, "px", ttl.Milliseconds(), "nx", "get")
}

// Option configures a Store.
type Option func(*Store)

// WithWait makes every claim and completion wait, on the same connection,
// until n replicas acknowledged it or timeout passed (Redis WAIT). It
// narrows what an asynchronous failover can lose; it is not consensus: a
// write acknowledged by fewer replicas is still in force on the master,
// and onShort, when not nil, is called with the operation's name. On a
// Cluster the write and its WAIT go together to the key's master.
func WithWait(n int, timeout time.Duration, onShort func(op string)) Option {
	return func(s *Store) {
		s.waitReplicas, s.waitTimeout, s.onWaitShort = n, timeout, onShort
	}
}

// WithSealing seals every record written with the first of keys (each
// KeySize bytes) and opens records sealed with any of them; with required,
// an unsealed record is unreadable. Redis keys are then derived with
// HMAC-SHA-256 keyed by derivation, or, when it is nil, by a subkey of the
// first key: rotating that key then moves every key, so a deployment that
// rotates passes a derivation secret of its own.
func WithSealing(keys [][]byte, required bool, derivation []byte) (Option, error) {
	sl, err := newSealer(keys, required)
	if err != nil {
		return nil, err
	}
	if derivation == nil {
		derivation = derivationKey(keys[0])
	}
	return func(s *Store) { s.seal, s.keyMAC = sl, derivation }, nil
}

// WithKeySecret derives Redis keys with HMAC-SHA-256 keyed by secret, so
// that nobody without it can compute where a principal's key lives.
func WithKeySecret(secret []byte) Option {
	return func(s *Store) { s.keyMAC = secret }
}

// encode is rec's stored form under key: sealed when sealing is on.
func (s *Store) encode(key string, rec *Record) []byte {
	if s.seal != nil {
		return s.seal.seal(key, rec)
	}
	return rec.Encode()
}

// Key derives the Redis key for an idempotency key presented by principal
// on scope. Inputs are length-prefixed before hashing, so no two different
// triples share bytes, and Redis never holds the raw key or principal; with
// a derivation secret the hash is an HMAC, which nobody without the secret
// can compute.
func (s *Store) Key(principal, scope, key string) string {
	h := sha256.New()
	if s.keyMAC != nil {
		h = hmac.New(sha256.New, s.keyMAC)
	}
	frameParts(h, principal, scope, key)
	var sum [sha256.Size]byte
	return s.prefix + hex.EncodeToString(h.Sum(sum[:0]))
}

// frameParts writes each part length-prefixed, so that no two different
// lists of parts write the same bytes.
func frameParts(h hash.Hash, parts ...string) {
	var n [binary.MaxVarintLen64]byte
	for _, part := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write([]byte(part))
	}
}

// Result is the outcome of a Claim.
type Result struct {
	// Claimed reports that the caller now owns the key.
	Claimed bool
	// Existing is the record found when not Claimed.
	Existing *Record
	// TTL is what is left of Existing's lease when it is InProgress (at
	// least 1ms), for Retry-After; zero when Existing is orphaned (see
	// Record.Orphaned). It is zero for a completed record: a replay does
	// not need it, and not asking saves a command.
	TTL time.Duration
}

// Claim takes key for rec's owner with a lease, or returns the record that
// already holds it, in one round trip. rec must be InProgress.
//
// On Redis 7 the round trip is one native command, SET key value NX PX
// lease GET, which costs Redis less CPU than a script (docs/benchmarks.md,
// "Tuning done"); only a claim that finds another attempt still in
// progress asks for its PTTL, in a second round trip on that rare path. Redis 6.2 rejects NX with GET; then
// the claim script does the same, and is used from then on.
func (s *Store) Claim(ctx context.Context, key string, rec *Record, lease time.Duration) (Result, error) {
	if s.full.Load() {
		return s.claimWhenFull(ctx, key, rec, lease+rec.Tail)
	}
	value := s.encode(key, rec)
	lease += rec.Tail // the record outlives its lease by its tail
	if s.scriptClaim.Load() {
		return s.claimByScript(ctx, key, rec, value, lease)
	}
	var raw string
	var err error
	if s.waitReplicas > 0 {
		pipe, perr := s.writePipeline(ctx, key)
		if perr != nil {
			return Result{}, s.unavailable("claim", perr)
		}
		set := setNXGet(ctx, key, value, lease)
		_ = pipe.Process(ctx, set)
		wait := s.wait(ctx, pipe)
		_, _ = pipe.Exec(ctx)
		raw, err = set.Result()
		if errors.Is(err, redis.Nil) {
			s.checkWait("claim", wait)
		}
	} else {
		set := setNXGet(ctx, key, value, lease)
		if err := s.exec(ctx, len(value), set); err != nil {
			return Result{}, s.unavailable("claim", err)
		}
		raw, err = set.Result()
	}
	switch {
	case errors.Is(err, redis.Nil):
		return Result{Claimed: true}, nil
	case redis.HasErrorPrefix(err, "syntax error"):
		s.scriptClaim.Store(true) // Redis < 7.0
		return s.claimByScript(ctx, key, rec, value, lease)
	case err != nil:
		return Result{}, s.unavailable("claim", err)
	}
	return s.found(ctx, key, rec, raw, lease)
}

// found interprets the value a claim read under key; for a record in
// progress it asks the key's PTTL, for Retry-After and to tell an orphaned
// record. When PTTL fails, the whole lease is an upper bound; when the key
// has just gone, a retry may come at once.
func (s *Store) found(ctx context.Context, key string, rec *Record, raw string, lease time.Duration) (Result, error) {
	res, err := s.existing(key, rec, raw, 0)
	if err != nil || res.Claimed || res.Existing.State != InProgress {
		return res, err
	}
	pttl := redis.NewDurationCmd(ctx, time.Millisecond, "pttl", key)
	ttl := lease
	if s.exec(ctx, 0, pttl) == nil && pttl.Err() == nil {
		ttl = pttl.Val()
	}
	res.TTL = leaseLeft(res.Existing, max(ttl, time.Millisecond))
	return res, nil
}

// leaseLeft is what is left of rec's lease when its key has ttl left: all
// of it, less the record's tail, and at least 1ms unless orphaned.
func leaseLeft(rec *Record, ttl time.Duration) time.Duration {
	if rec.Tail > 0 {
		return max(ttl-rec.Tail, 0)
	}
	return max(ttl, time.Millisecond)
}

func (s *Store) claimByScript(ctx context.Context, key string, rec *Record, value []byte, lease time.Duration) (Result, error) {
	var v any
	var err error
	var wait *redis.Cmd
	if s.waitReplicas > 0 {
		var run *redis.Cmd
		run, wait = s.runAndWait(ctx, claimScript, key, value, lease.Milliseconds())
		v, err = run.Result()
	} else {
		v, err = s.eval(ctx, claimScript, key, len(value), value, lease.Milliseconds()).Result()
	}
	if err != nil {
		return Result{}, s.unavailable("claim", err)
	}
	if n, ok := v.(int64); ok && n == 1 {
		s.checkWait("claim", wait)
		return Result{Claimed: true}, nil
	}
	pair, ok := v.([]any)
	if !ok || len(pair) != 2 {
		return Result{}, fmt.Errorf("unexpected reply %T: %w", v, ErrUnavailable)
	}
	raw, _ := pair[0].(string)
	ttl, _ := pair[1].(int64)
	return s.existing(key, rec, raw, time.Duration(ttl)*time.Millisecond)
}

// existing interprets the value a claim found under its key.
func (s *Store) existing(key string, rec *Record, raw string, ttl time.Duration) (Result, error) {
	found, err := s.seal.open(key, []byte(raw))
	if err != nil {
		return Result{}, err
	}
	// go-redis resends a command whose reply was lost; the resend then finds
	// the record the first send wrote. That is our claim, not a conflict.
	if found.Token == rec.Token && found.State == InProgress {
		return Result{Claimed: true}, nil
	}
	if found.State != InProgress {
		return Result{Existing: found}, nil
	}
	return Result{Existing: found, TTL: leaseLeft(found, ttl)}, nil
}

// Get returns the record under key, or nil when there is none, and for an
// in-progress record what is left of its lease (see Result.TTL).
func (s *Store) Get(ctx context.Context, key string) (*Record, time.Duration, error) {
	get := redis.NewStringCmd(ctx, "get", key)
	pttl := redis.NewDurationCmd(ctx, time.Millisecond, "pttl", key)
	if err := s.exec(ctx, 0, get, pttl); err != nil {
		return nil, 0, s.unavailable("get", err)
	}
	raw, err := get.Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, s.unavailable("get", err)
	}
	rec, err := s.seal.open(key, raw)
	if err != nil {
		return nil, 0, err
	}
	if rec.State == InProgress {
		return rec, leaseLeft(rec, max(pttl.Val(), 0)), nil
	}
	return rec, max(pttl.Val(), 0), nil
}

// Renew extends the owner's lease, for rec's token and tail. It returns
// ErrLeaseLost when the key is gone or owned by someone else, and nil when
// the record was already completed by this owner (a renewal racing the
// completion).
func (s *Store) Renew(ctx context.Context, key string, rec *Record, lease time.Duration) error {
	n, err := s.eval(ctx, renewScript, key, 0, rec.Token[:], (lease + rec.Tail).Milliseconds()).Int64()
	if err != nil {
		return s.unavailable("renew", err)
	}
	switch n {
	case 1, -2:
		return nil
	default:
		return fmt.Errorf("renew: %w", ErrLeaseLost)
	}
}

// Completion says how a Complete was written.
type Completion int

const (
	// Stored is the normal case: our in-progress record was replaced.
	Stored Completion = iota + 1
	// StoredAfterLapse means our lease had lapsed but nobody had claimed
	// the key since, so the record was stored anyway.
	StoredAfterLapse
)

// Complete replaces the owner's in-progress record with rec (Completed),
// kept for retention. It returns ErrLeaseLost, writing nothing, when
// another owner holds the key.
func (s *Store) Complete(ctx context.Context, key string, rec *Record, retention time.Duration) (Completion, error) {
	var buf *[]byte
	var value []byte
	if s.seal == nil {
		buf = valuePool.Get().(*[]byte)
		value = rec.encodeInto(*buf)
	} else {
		value = s.encode(key, rec)
	}
	args := []any{rec.Token[:], value, retention.Milliseconds(), s.watch.publishCommand()}
	var n int64
	var err error
	if s.waitReplicas > 0 {
		run, wait := s.runAndWait(ctx, completeScript, key, args...)
		if n, err = run.Int64(); err == nil {
			s.checkWait("complete", wait)
		}
	} else {
		n, err = s.eval(ctx, completeScript, key, len(value), args...).Int64()
	}
	if buf != nil && err == nil && cap(value) <= maxPooledValue {
		// Redis has the value (an error may mean a command still in
		// flight, which must keep its buffer).
		*buf = value[:0]
		valuePool.Put(buf)
	}
	if err != nil {
		return 0, s.unavailable("complete", err)
	}
	switch n {
	case 1, 3:
		return Stored, nil
	case 2:
		return StoredAfterLapse, nil
	default:
		return 0, fmt.Errorf("complete: %w", ErrLeaseLost)
	}
}

// SettleOrphan replaces the orphaned in-progress record of orphan's owner
// (see Record.Orphaned) with rec, a Completed record of the caller's own,
// kept for retention. The check is atomic with the write: it returns
// ErrLeaseLost, writing nothing, when the key changed since it was read
// (gone, completed, claimed by another) or the owner renewed its lease
// after all; the caller then claims again.
func (s *Store) SettleOrphan(ctx context.Context, key string, orphan *Record, rec *Record, retention time.Duration) error {
	value := s.encode(key, rec)
	args := []any{orphan.Token[:], value, retention.Milliseconds(), orphan.Tail.Milliseconds(), s.watch.publishCommand()}
	var n int64
	var err error
	if s.waitReplicas > 0 {
		run, wait := s.runAndWait(ctx, orphanScript, key, args...)
		if n, err = run.Int64(); err == nil && n == 1 {
			s.checkWait("complete", wait)
		}
	} else {
		n, err = s.eval(ctx, orphanScript, key, len(value), args...).Int64()
	}
	if err != nil {
		return s.unavailable("settle orphan", err)
	}
	if n != 1 {
		return fmt.Errorf("settle orphan: %w", ErrLeaseLost)
	}
	return nil
}

// runAndWait runs script and WAIT in one pipeline, so WAIT follows the
// write on its connection. A Redis that lost its script cache (a restart,
// a failover) gets the script loaded and the pipeline resent. The caller
// passes wait to checkWait when the script wrote.
func (s *Store) runAndWait(ctx context.Context, script *redis.Script, key string, args ...any) (run, wait *redis.Cmd) {
	for attempt := 0; ; attempt++ {
		pipe, err := s.writePipeline(ctx, key)
		if err != nil {
			return redis.NewCmdResult(nil, err), nil
		}
		run = pipe.EvalSha(ctx, script.Hash(), []string{key}, args...)
		wait = s.wait(ctx, pipe)
		_, _ = pipe.Exec(ctx)
		if err := run.Err(); attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := script.Load(ctx, s.client).Err(); err != nil {
				return redis.NewCmdResult(nil, err), nil
			}
			continue
		}
		return run, wait
	}
}

// Release deletes the owner's in-progress record so a retry can claim the
// key. A key that is already gone is not an error; one owned by someone
// else, or already completed, is ErrLeaseLost and is left alone.
func (s *Store) Release(ctx context.Context, key string, token Token) error {
	n, err := s.eval(ctx, releaseScript, key, 0, token[:], s.watch.publishCommand()).Int64()
	if err != nil {
		return s.unavailable("release", err)
	}
	if n < 0 {
		return fmt.Errorf("release: %w", ErrLeaseLost)
	}
	return nil
}

// ErrStateChanged means Forget found the key in another state than the
// caller said, and left it alone.
var ErrStateChanged = errors.New("claim: the record is not in the state given")

// Forget deletes the record under key, only while it is in state: an
// operator releases a stuck claim (InProgress) or forgets a stored answer
// (Completed), never the other by mistake. A key that is gone is not an
// error; one in another state is ErrStateChanged.
func (s *Store) Forget(ctx context.Context, key string, state State) error {
	n, err := s.eval(ctx, forgetScript, key, 0, int(state), s.watch.publishCommand()).Int64()
	if err != nil {
		return s.unavailable("forget", err)
	}
	if n < 0 {
		return fmt.Errorf("forget: %w", ErrStateChanged)
	}
	return nil
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
	return unavailable(op, err)
}

func unavailable(op string, err error) error {
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}
