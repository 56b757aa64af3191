// Package claim stores idempotency claims and settled responses in Redis.
// It is the only package that talks to Redis.
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
	"strings"
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
	// ErrNotSent marks a failed Claim that provably wrote nothing: the
	// client had no connection when it began and made none until it
	// failed (sent.go).
	ErrNotSent = errors.New("claim: nothing sent")
)

// Store keeps claims in Redis.
type Store struct {
	client redis.UniversalClient
	prefix string
	// full refuses new claims (SetFull).
	full atomic.Bool

	// seal, when set, seals records and opens sealed ones; keyMAC, when
	// set, keys the Redis key derivation.
	seal   *sealer
	keyMAC []byte
	// macs pools derive's buffers and HMACs keyed with keyMAC.
	macs sync.Pool

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

	// fpMAC, when set, keys fingerprints (a subkey of the key secret):
	// records with keyed fingerprints are compared with it, and with
	// keyedWrites (store.record_format: 2) every record is written so.
	fpMAC       []byte
	keyedWrites bool
	// derivedFP (WithDerivedFingerprints) sets fpMAC from keyMAC once
	// every option is applied.
	derivedFP bool

	// clock is what the clock measurements said (clock.go); clockNow,
	// when set, stands in for time.Now there (tests).
	clock    clockState
	clockNow func() time.Time
	// streamLimit is the longest streamed record a claim reads back (0:
	// any); WithStreamReadLimit.
	streamLimit int

	// dials counts the connections this store's client made (sent.go).
	dials atomic.Uint64
	// epochs are the masters' epochs (epoch.go).
	epochs epochState
	// compress stores completed bodies zstd-compressed (compress.go).
	compress bool
	// compact writes completed records in the compact layout (compact.go).
	compact bool
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

// WithStreamReadLimit bounds the streamed records a claim reads back: a
// longer one (planted or edited: no owner stores more than its route's
// max_response_body) is not transferred, and the claim answers a
// RecordError (ReasonTooLarge). Zero reads any.
func WithStreamReadLimit(n int) Option {
	return func(s *Store) { s.streamLimit = max(n, 0) }
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

// New returns a Store using client, with every key under prefix.
// Concurrent operations are coalesced into pipelines (WithPipeline) unless
// WithWait is given: WAIT blocks its connection, and would hold up every
// operation behind it in a batch.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Store {
	s := &Store{client: client, prefix: prefix, batch: &batcher{client: client}, watch: newWatcher(client)}
	s.countDials()
	for _, o := range opts {
		o(s)
	}
	if s.derivedFP && s.fpMAC == nil && s.seal != nil {
		s.fpMAC = fingerprintMAC(s.keyMAC)
	}
	if s.waitReplicas > 0 {
		s.batch = nil
	}
	return s
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

// encode is rec's stored form under key: sealed when sealing is on.
func (s *Store) encode(key string, rec *Record) []byte {
	rec = s.stored(rec)
	if s.seal != nil {
		return s.seal.seal(key, rec)
	}
	return rec.Encode()
}

// WithKeyedFingerprints keys stored fingerprints with a subkey of secret
// (the key derivation secret, store.key_secret_file; never a sealing key,
// which rotates): someone who reads Redis can no longer confirm a guessed
// request body against a record. Records whose fingerprint is keyed are
// compared with it whatever write says; write (store.record_format: 2)
// writes every record keyed, which releases before v0.4.0 cannot read.
func WithKeyedFingerprints(secret []byte, write bool) Option {
	return func(s *Store) { s.fpMAC, s.keyedWrites = fingerprintMAC(secret), write }
}

// WithDerivedFingerprints keys stored fingerprints, as WithKeyedFingerprints
// does, with a subkey of the Redis key derivation WithSealing set up from
// its first key when no key secret is given (store.record_format: 3 with
// encryption.key_files and no key_secret_file): a sealed record then never
// carries a fingerprint a guessed body can be checked against. write as
// for WithKeyedFingerprints. No Redis key changes: keys are derived as
// before. Without sealing it does nothing.
func WithDerivedFingerprints(write bool) Option {
	return func(s *Store) { s.derivedFP, s.keyedWrites = true, write }
}

// fingerprintMAC is the subkey of secret that keys fingerprints.
func fingerprintMAC(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("idemproxy fingerprint v1"))
	return m.Sum(nil)
}

// keyFingerprint is fp's keyed form.
func (s *Store) keyFingerprint(fp Fingerprint) Fingerprint {
	m := hmac.New(sha256.New, s.fpMAC)
	m.Write(fp[:])
	var out Fingerprint
	copy(out[:], m.Sum(nil))
	return out
}

// stored is rec as this store writes it: its body compressed
// (compress.go), in the compact layout (compact.go) and with a keyed
// fingerprint, as far as this store writes each; rec itself when none
// applies, else one copy.
func (s *Store) stored(rec *Record) *Record {
	body, compress := s.compressedBody(rec)
	compact := s.compact && s.seal == nil && rec.State == Completed && !rec.Compact
	keyed := s.keyedWrites && s.fpMAC != nil && !rec.KeyedFingerprint
	if !compress && !compact && !keyed {
		return rec
	}
	c := *rec // one copy, whatever changes
	if compress {
		c.Body, c.BodyCompressed = body, true
	}
	c.Compact = c.Compact || compact
	if keyed {
		c.Fingerprint, c.KeyedFingerprint = s.keyFingerprint(rec.Fingerprint), true
	}
	return &c
}

// SameRequest reports whether rec, a stored record, was written for the
// request whose fingerprint is fp, whichever form its fingerprint has.
func (s *Store) SameRequest(rec *Record, fp Fingerprint) bool {
	if !rec.KeyedFingerprint {
		return rec.Fingerprint == fp
	}
	if s.fpMAC == nil {
		return false // keyed with a secret this store does not have
	}
	k := s.keyFingerprint(fp)
	return hmac.Equal(rec.Fingerprint[:], k[:])
}

// Key derives the Redis key for an idempotency key presented by principal
// on scope. Inputs are length-prefixed before hashing, so no two different
// triples share bytes, and Redis never holds the raw key or principal; with
// a derivation secret the hash is an HMAC, which nobody without the secret
// can compute.
func (s *Store) Key(principal, scope, key string) string {
	return s.derive("", principal, scope, key)
}

// QuotaKey is the Redis key of principal's new-key counter on scope,
// derived as Key derives claim keys (with its secret, when one is set).
func (s *Store) QuotaKey(principal, scope string) string {
	return s.derive("q:", "quota", principal, scope)
}

// derive is prefix + kind + the hex SHA-256 (an HMAC with the derivation
// secret) of parts, each part length-prefixed so that no two different
// lists of parts hash the same bytes. The framed parts go in one buffer
// and one hash call, and the HMAC is pooled: a key costs the string it
// returns (it built a hasher, an HMAC's two, and a few escaping buffers
// every request before).
func (s *Store) derive(kind string, parts ...string) string {
	d, _ := s.macs.Get().(*deriver)
	if d == nil {
		d = &deriver{}
		if s.keyMAC != nil {
			d.mac = hmac.New(sha256.New, s.keyMAC)
		}
	}
	b := d.buf[:0]
	for _, part := range parts {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	if d.mac == nil {
		d.sum = sha256.Sum256(b)
	} else {
		d.mac.Reset()
		d.mac.Write(b)
		d.mac.Sum(d.sum[:0])
	}
	if cap(b) <= 1<<10 {
		d.buf = b
	}
	// One allocation: prefix + kind + string(hexSum[:]) is two
	// (TestKeyDerivationGolden counts them).
	var out strings.Builder
	out.Grow(len(s.prefix) + len(kind) + 2*sha256.Size)
	out.WriteString(s.prefix)
	out.WriteString(kind)
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], d.sum[:])
	out.Write(hexSum[:])
	s.macs.Put(d)
	return out.String()
}

// deriver is what derive reuses: the framing buffer, the sum, and the
// HMAC when keys are derived with a secret.
type deriver struct {
	mac hash.Hash
	buf []byte
	sum [sha256.Size]byte
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
	return unavailable(op, err)
}

// unavailable reads "claim: store unavailable (op): cause": the
// sentinel already names the package.
func unavailable(op string, err error) error {
	return fmt.Errorf("%w (%s): %w", ErrUnavailable, op, err)
}
