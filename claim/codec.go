package claim

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"strings"
	"sync"
	"time"
)

// Codec is the part of a store every backend shares: where a key lives
// (derivation, with its secret) and the bytes a record is stored as
// (formats, compaction, compression, sealing). A backend keeps what
// Codec.Encode gives and hands back what it kept to Codec.Open; it never
// builds a record's bytes itself.
type Codec struct {
	prefix string

	// seal, when set, seals records and opens sealed ones; keyMAC, when
	// set, keys the key derivation.
	seal   *sealer
	keyMAC []byte
	// macs pools derive's buffers and HMACs keyed with keyMAC.
	macs sync.Pool

	// fpMAC, when set, keys fingerprints (a subkey of the key secret):
	// records with keyed fingerprints are compared with it, and with
	// keyedWrites (store.record_format: 2) every record is written so.
	fpMAC       []byte
	keyedWrites bool
	// derivedFP (WithDerivedFingerprints) sets fpMAC from keyMAC once
	// every option is applied.
	derivedFP bool

	// compress stores completed bodies zstd-compressed (compress.go).
	compress bool
	// compact writes completed records in the compact layout (compact.go).
	compact bool
	// streamLimit is the longest streamed record a claim reads back (0:
	// any); WithStreamReadLimit.
	streamLimit int
}

// Options are what a store is built with: its Codec, and the settings a
// backend reads for itself (each backend's doc says which it honours).
type Options struct {
	codec *Codec

	// WaitReplicas > 0 waits after claims and completions until that many
	// replicas acknowledged them, or WaitTimeout passed; OnWaitShort, when
	// set, hears of each write acknowledged by fewer (WithWait).
	WaitReplicas int
	WaitTimeout  time.Duration
	OnWaitShort  func(op string)
	// Pipeline coalesces concurrent operations into one round trip (the
	// default); OnBatch hears the size of each (WithPipeline,
	// WithBatchObserver).
	Pipeline bool
	OnBatch  func(ops int)
	// OnEpoch hears of every epoch a look finds (WithEpochObserver).
	OnEpoch func(Epoch)
	// NodeName names the node Health reports when the backend has no
	// address of its own to give it (WithNodeName).
	NodeName string
	// Now, when set, is this process' clock (WithClock).
	Now func() time.Time
	// StreamRows stores a stream's chunks as rows of their own where the
	// backend appends by rewriting (PostgreSQL), a form releases before
	// v0.8.0 cannot read (WithStreamRows: store.record_format 5).
	StreamRows bool
}

// Option configures a store.
type Option func(*Options)

// Build applies opts to a store under prefix: the Codec, and the
// settings left to the backend.
func Build(prefix string, opts ...Option) (*Codec, Options) {
	o := Options{codec: &Codec{prefix: prefix}, Pipeline: true}
	for _, opt := range opts {
		opt(&o)
	}
	c := o.codec
	if c.derivedFP && c.fpMAC == nil && c.seal != nil {
		c.fpMAC = fingerprintMAC(c.keyMAC)
	}
	return c, o
}

// NewCodec is Build's Codec alone.
func NewCodec(prefix string, opts ...Option) *Codec {
	c, _ := Build(prefix, opts...)
	return c
}

// WithWait makes every claim and completion wait until n replicas
// acknowledged it or timeout passed (Redis WAIT). It narrows what an
// asynchronous failover can lose; it is not consensus: a write
// acknowledged by fewer replicas is still in force on the primary, and
// onShort, when not nil, is called with the operation's name.
func WithWait(n int, timeout time.Duration, onShort func(op string)) Option {
	return func(o *Options) {
		o.WaitReplicas, o.WaitTimeout, o.OnWaitShort = n, timeout, onShort
	}
}

// WithPipeline turns the coalescing of concurrent operations into
// pipelines on (the default) or off.
func WithPipeline(on bool) Option {
	return func(o *Options) { o.Pipeline = on }
}

// WithBatchObserver has observe called with the number of operations in
// every pipeline the store sends (when coalescing is on).
func WithBatchObserver(observe func(ops int)) Option {
	return func(o *Options) { o.OnBatch = observe }
}

// WithEpochObserver has observe called for every epoch a look finds:
// Lost says the store lost its data (a marker this process had seen is
// gone). Call it before the store is used.
func WithEpochObserver(observe func(Epoch)) Option {
	return func(o *Options) { o.OnEpoch = observe }
}

// WithNodeName names the node a store's Health reports when the backend
// cannot name it itself: the master a Sentinel deployment monitors
// (go-redis' failover client has no address of its own).
func WithNodeName(name string) Option {
	return func(o *Options) { o.NodeName = name }
}

// WithStreamRows has a backend that would rewrite a stream's whole value
// on every append (PostgreSQL) store each chunk as a row of its own
// instead: its writes grow with the stream's length, not its square.
// Every release from v0.8.0 reads both forms; earlier ones only the
// whole value, so it is set only once a fleet runs v0.8.0 or later.
func WithStreamRows(on bool) Option {
	return func(o *Options) { o.StreamRows = on }
}

// WithClock makes the store read now as this process' clock, where it
// compares it with the store's (claim marks, FreeAbsent's two clocks): a
// test's process whose replies come late, or whose clock is off.
func WithClock(now func() time.Time) Option {
	return func(o *Options) { o.Now = now }
}

// WithSealing seals every record written with the first of keys (each
// KeySize bytes) and opens records sealed with any of them; with required,
// an unsealed record is unreadable. Keys are then derived with
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
	return func(o *Options) { o.codec.seal, o.codec.keyMAC = sl, derivation }, nil
}

// WithKeySecret derives keys with HMAC-SHA-256 keyed by secret, so that
// nobody without it can compute where a principal's key lives.
func WithKeySecret(secret []byte) Option {
	return func(o *Options) { o.codec.keyMAC = secret }
}

// WithStreamReadLimit bounds the streamed records a claim reads back: a
// longer one (planted or edited: no owner stores more than its route's
// max_response_body) is not transferred, and the claim answers a
// RecordError (ReasonTooLarge). Zero reads any.
func WithStreamReadLimit(n int) Option {
	return func(o *Options) { o.codec.streamLimit = max(n, 0) }
}

// WithKeyedFingerprints keys stored fingerprints with a subkey of secret
// (the key derivation secret, store.key_secret_file; never a sealing key,
// which rotates): someone who reads the store can no longer confirm a
// guessed request body against a record. Records whose fingerprint is
// keyed are compared with it whatever write says; write
// (store.record_format: 2) writes every record keyed, which releases
// before v0.4.0 cannot read.
func WithKeyedFingerprints(secret []byte, write bool) Option {
	return func(o *Options) { o.codec.fpMAC, o.codec.keyedWrites = fingerprintMAC(secret), write }
}

// WithDerivedFingerprints keys stored fingerprints, as WithKeyedFingerprints
// does, with a subkey of the key derivation WithSealing set up from its
// first key when no key secret is given (store.record_format: 3 with
// encryption.key_files and no key_secret_file): a sealed record then never
// carries a fingerprint a guessed body can be checked against. write as
// for WithKeyedFingerprints. No key changes: keys are derived as before.
// Without sealing it does nothing.
func WithDerivedFingerprints(write bool) Option {
	return func(o *Options) { o.codec.derivedFP, o.codec.keyedWrites = true, write }
}

// Prefix is what every key of this store starts with.
func (c *Codec) Prefix() string { return c.prefix }

// StreamReadLimit is the longest streamed record a claim reads back (0:
// any).
func (c *Codec) StreamReadLimit() int { return c.streamLimit }

// Sealed reports whether records are written sealed.
func (c *Codec) Sealed() bool { return c.seal != nil }

// Encode is rec's stored form under key: sealed when sealing is on.
func (c *Codec) Encode(key string, rec *Record) []byte {
	return c.AppendEncoded(nil, key, rec)
}

// AppendEncoded appends rec's stored form under key to buf (a sealed
// record is written afresh, buf unused).
func (c *Codec) AppendEncoded(buf []byte, key string, rec *Record) []byte {
	rec = c.stored(rec)
	if c.seal != nil {
		return c.seal.seal(key, rec)
	}
	return rec.encodeInto(buf)
}

// Open reads a value stored under key, opened when sealed. A compressed
// body stays compressed (Record.Inflate).
func (c *Codec) Open(key string, raw []byte) (*Record, error) {
	return c.seal.open(key, raw)
}

// fingerprintMAC is the subkey of secret that keys fingerprints.
func fingerprintMAC(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("idemproxy fingerprint v1"))
	return m.Sum(nil)
}

// keyFingerprint is fp's keyed form.
func (c *Codec) keyFingerprint(fp Fingerprint) Fingerprint {
	m := hmac.New(sha256.New, c.fpMAC)
	m.Write(fp[:])
	var out Fingerprint
	copy(out[:], m.Sum(nil))
	return out
}

// stored is rec as this codec writes it: its body compressed
// (compress.go), in the compact layout (compact.go) and with a keyed
// fingerprint, as far as this codec writes each; rec itself when none
// applies, else one copy.
func (c *Codec) stored(rec *Record) *Record {
	body, compress := c.compressedBody(rec)
	compact := c.compact && c.seal == nil && rec.State == Completed && !rec.Compact
	keyed := c.keyedWrites && c.fpMAC != nil && !rec.KeyedFingerprint
	if !compress && !compact && !keyed {
		return rec
	}
	cp := *rec // one copy, whatever changes
	if compress {
		cp.Body, cp.BodyCompressed = body, true
	}
	cp.Compact = cp.Compact || compact
	if keyed {
		cp.Fingerprint, cp.KeyedFingerprint = c.keyFingerprint(rec.Fingerprint), true
	}
	return &cp
}

// SameRequest reports whether rec, a stored record, was written for the
// request whose fingerprint is fp, whichever form its fingerprint has.
func (c *Codec) SameRequest(rec *Record, fp Fingerprint) bool {
	if !rec.KeyedFingerprint {
		return rec.Fingerprint == fp
	}
	if c.fpMAC == nil {
		return false // keyed with a secret this codec does not have
	}
	k := c.keyFingerprint(fp)
	return hmac.Equal(rec.Fingerprint[:], k[:])
}

// Key derives the store key for an idempotency key presented by principal
// on scope. Inputs are length-prefixed before hashing, so no two different
// triples share bytes, and the store never holds the raw key or principal;
// with a derivation secret the hash is an HMAC, which nobody without the
// secret can compute.
func (c *Codec) Key(principal, scope, key string) string {
	return c.derive("", principal, scope, key)
}

// QuotaKey is the key of principal's new-key counter on scope, derived as
// Key derives claim keys (with its secret, when one is set).
func (c *Codec) QuotaKey(principal, scope string) string {
	return c.derive("q:", "quota", principal, scope)
}

// derive is prefix + kind + the hex SHA-256 (an HMAC with the derivation
// secret) of parts, each part length-prefixed so that no two different
// lists of parts hash the same bytes. The framed parts go in one buffer
// and one hash call, and the HMAC is pooled: a key costs the string it
// returns (it built a hasher, an HMAC's two, and a few escaping buffers
// every request before).
func (c *Codec) derive(kind string, parts ...string) string {
	d, _ := c.macs.Get().(*deriver)
	if d == nil {
		d = &deriver{}
		if c.keyMAC != nil {
			d.mac = hmac.New(sha256.New, c.keyMAC)
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
	out.Grow(len(c.prefix) + len(kind) + 2*sha256.Size)
	out.WriteString(c.prefix)
	out.WriteString(kind)
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], d.sum[:])
	out.Write(hexSum[:])
	c.macs.Put(d)
	return out.String()
}

// deriver is what derive reuses: the framing buffer, the sum, and the
// HMAC when keys are derived with a secret.
type deriver struct {
	mac hash.Hash
	buf []byte
	sum [sha256.Size]byte
}
