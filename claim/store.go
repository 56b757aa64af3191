package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// Completion says how a Complete was written.
type Completion int

const (
	// Stored is the normal case: our in-progress record was replaced.
	Stored Completion = iota + 1
	// StoredAfterLapse means our lease had lapsed but nobody had claimed
	// the key since, so the record was stored anyway.
	StoredAfterLapse
)

// ErrStateChanged means Forget found the key in another state than the
// caller said, and left it alone.
var ErrStateChanged = errors.New("claim: the record is not in the state given")

// SetAt is when the claim's SET ran on Redis' clock, as its own round
// trip read it; zero when the caller did not claim the key, or Redis'
// clock was not read.
func (r Result) SetAt() time.Time {
	if !r.Claimed {
		return time.Time{}
	}
	return r.ServerNow
}

// ReadAt is Redis' clock as the claim's round trip read it, claimed or
// not; zero when not read.
func (r Result) ReadAt() time.Time { return r.ServerNow }

// ExpiryJitter is how far two readings of one unchanged key's expiry
// (the store's clock plus the key's TTL, read in one script) may differ:
// milliseconds on Redis, up to the embedded store's clock tick. A renewal
// moves the expiry by at least a third of the shortest lease (333 ms).
const ExpiryJitter = 100 * time.Millisecond

// SameExpiry reports whether a and b, two readings of a key's expiry on
// the store's clock (Record.Expires), are the same expiry: no renewal
// came between them.
func SameExpiry(a, b time.Time) bool {
	d := a.Sub(b)
	return -ExpiryJitter <= d && d <= ExpiryJitter
}

// ErrTooEarly is FreeAbsent's answer while the first attempt is younger
// than the age an absent answer needs; TooEarlyError says how much
// younger.
var ErrTooEarly = errors.New("claim: too early to believe the first attempt absent")

// TooEarlyError is ErrTooEarly with the time still to wait.
type TooEarlyError struct {
	Left time.Duration
	// Skew, when not zero, is how far the store's clock was ahead of the
	// caller's (behind, negative): more than the rules allow, so the age
	// could not be told at all.
	Skew time.Duration
}

func (e *TooEarlyError) Error() string {
	if e.Skew != 0 {
		return fmt.Sprintf("%v (the store's clock and this one differ by %s)", ErrTooEarly, e.Skew)
	}
	return fmt.Sprintf("%v (%s to go)", ErrTooEarly, e.Left)
}

func (e *TooEarlyError) Unwrap() error { return ErrTooEarly }

// Result is the outcome of a Claim.
type Result struct {
	// Claimed reports that the caller now owns the key.
	Claimed bool
	// Existing is the record found when not Claimed.
	Existing *Record
	// TTL is what is left of Existing's lease when it is InProgress (at
	// least 1ms), for Retry-After; zero when Existing is orphaned (see
	// Record.Orphaned). It is zero for a completed record: a replay does
	// not need it.
	TTL time.Duration
	// Unforwarded reports that Existing is a claim its owner never
	// forwarded and never will (mark.go): ReleaseUnforwarded frees it.
	Unforwarded bool
	// Renewed reports that the claim, before Claim returned it, was
	// renewed: its own round trip showed that its SET ran, on Redis'
	// clock, so long after its Created time that a reader could take it
	// for never forwarded (Redis' clock, or this process', is off or
	// stepped). Renewed, no reader ever does.
	Renewed bool

	// PTTL and ServerNow are what was left of the key's lease and the
	// store's clock, read in the claim's own round trip (zero when not
	// read): SetAt and ReadAt.
	PTTL      time.Duration
	ServerNow time.Time
}

// ErrQuota means the principal has claimed as many new keys on this route
// as its quota allows within the window. Errors matching it are QuotaErrors.
var ErrQuota = errors.New("claim: new-key quota reached")

// QuotaError says when the quota's window ends.
type QuotaError struct {
	// RetryAfter is what is left of the window.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string { return ErrQuota.Error() }

// Is makes every QuotaError an ErrQuota.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Quota bounds the new keys one principal claims on one scope per window,
// counted in Redis, so shared by every replica. Retries and replays of a
// key that exists never count.
type Quota struct {
	// Key is the counter's Redis key (Store.QuotaKey).
	Key string
	// Limit is how many new keys a window allows; 0 counts nothing.
	Limit  int64
	Window time.Duration
}

// ErrFull means Redis is above the claim memory limit: new claims are
// refused, so that the claims already in flight still find room to store
// their outcome (a full noeviction Redis refuses every write, completions
// included, and a completion refused is a retry that executes again).
var ErrFull = errors.New("claim: store above its claim memory limit")

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

// Unavailable wraps a backend's failure to reach its store as
// ErrUnavailable. It reads "claim: store unavailable (op): cause": the
// sentinel already names the package.
func Unavailable(op string, err error) error {
	return fmt.Errorf("%w (%s): %w", ErrUnavailable, op, err)
}

// Epoch is what is known of one master's epoch.
type Epoch struct {
	// Master names the master, as Health does.
	Master string
	// Start is when the epoch began, on Redis' clock.
	Start time.Time
	// AfterLoss says the epoch began because the store lost its data
	// (its marker was created by a process that had seen the previous
	// one); requests first sent before Start are refused. A new store's
	// first epoch refuses nothing.
	AfterLoss bool
	// Lost is set when this look found the marker gone on a master whose
	// epoch this process had seen before: the store lost its data.
	Lost bool
	// Reason, when the store itself began the epoch after a loss it
	// detected (PostgreSQL: another system identifier, a timeline after
	// asynchronous replication), says what it saw; empty otherwise.
	Reason string
}

// MasterHealth is what one look at one Redis master found.
type MasterHealth struct {
	// Master names the master: its address, or on Sentinel the monitored
	// master's name. Empty when the deployment could not even be asked
	// which masters it has (a Cluster whose slot map cannot be loaded).
	Master string
	// Err is why the master did not answer; nil when it is up.
	Err error
	// MemoryRatio is used_memory over maxmemory; 0 without a maxmemory,
	// or when the master did not answer.
	MemoryRatio float64
	// Sized is set when the master told its size: Keys (every database's
	// keys, INFO keyspace) and UsedBytes (used_memory). On a Redis shared
	// with other applications they count theirs too.
	Sized     bool
	Keys      int64
	UsedBytes int64
	// Clock is this process' clock against the master's (clock.go);
	// nil when the master did not answer TIME.
	Clock *ClockReading
	// Cleanup is set by a store whose expired records wait to be
	// deleted (PostgreSQL: reads ignore them at once): how many, how long
	// the oldest has waited, and the oldest claim in progress.
	Cleanup *Cleanup
}

// Cleanup is what a store that deletes expired records itself reports.
type Cleanup struct {
	// Expired counts expired records not deleted yet (up to 10,000),
	// and Lag is how long ago the oldest of them expired.
	Expired int64
	Lag     time.Duration
	// OldestClaim is the age of the oldest claim in progress, on the
	// store's clock (0: none).
	OldestClaim time.Duration
}

// MaxClockOffset is how far a sidecar's clock may be from Redis' while it
// marks its claims. NTP keeps hosts within milliseconds; a host further
// off than this stops marking (its claims are then never freed early:
// 409s, or outcome-unknown, instead) until it is back within it.
const MaxClockOffset = 500 * time.Millisecond

// ClockReading is one master's clock against this process', from one TIME
// round trip.
type ClockReading struct {
	// Min and Max bound this process' clock minus the master's.
	Min, Max time.Duration
}

// Good reports that the whole interval is within MaxClockOffset.
func (c ClockReading) Good() bool { return -MaxClockOffset <= c.Min && c.Max <= MaxClockOffset }

// Bad reports that none of the interval is within MaxClockOffset.
func (c ClockReading) Bad() bool { return c.Min > MaxClockOffset || c.Max < -MaxClockOffset }

// Offset is the middle of the interval.
func (c ClockReading) Offset() time.Duration { return (c.Min + c.Max) / 2 }

// The interfaces a backend implements. Every backend is one package under
// claim/ (redisstore today) whose Store implements Backend, and passes the
// shared contract suite (claim/contract) through a factory of its own.
// Record bytes come from the Codec, never from the backend: a record
// written by one backend reads the same from another.

// Claims is the protocol's store side on one key: take it, look at it,
// wait for it, keep it, settle it, give it back.
type Claims interface {
	// Claim takes key for rec's owner with a lease, or returns the
	// record that already holds it, in one round trip; q, when not zero,
	// counts a new key against the principal's quota.
	Claim(ctx context.Context, key string, rec *Record, lease time.Duration, q Quota) (Result, error)
	// Get returns the record under key (nil: none), and for an
	// in-progress record what is left of its lease.
	Get(ctx context.Context, key string) (*Record, time.Duration, error)
	// Watch wakes a waiter when key may have changed.
	Watch(ctx context.Context, key string) Watch
	// Renew extends the owner's lease (fenced on rec's token).
	Renew(ctx context.Context, key string, rec *Record, lease time.Duration) error
	// Complete replaces the owner's claim with rec, kept for retention.
	Complete(ctx context.Context, key string, rec *Record, retention time.Duration) (Completion, error)
	// Release deletes the owner's claim (fenced on token).
	Release(ctx context.Context, key string, token Token) error
}

// Recovery settles what an owner left behind: an orphaned claim, an
// outcome to ask the upstream about, a first attempt that never arrived.
type Recovery interface {
	SettleOrphan(ctx context.Context, key string, orphan, rec *Record, retention time.Duration) error
	TakeOver(ctx context.Context, key string, old, rec *Record, lease time.Duration, since time.Time) (time.Time, error)
	FreeAbsent(ctx context.Context, key string, token Token, since time.Time, after time.Duration) error
}

// Unsent frees claims that never reached the upstream: one whose claim
// was never confirmed to its owner, and one its owner never forwarded.
type Unsent interface {
	ReleaseUnconfirmed(ctx context.Context, key string, token Token) (found bool, err error)
	ReleaseUnforwarded(ctx context.Context, key string, ghost *Record) error
}

// Epochs date the store's data: when the data a key lives in began (a
// store that lost its data begins again), and when a named change was
// first seen.
type Epochs interface {
	EpochStart(ctx context.Context, key string) (time.Time, error)
	Since(ctx context.Context, name string, now time.Time) (time.Time, error)
}

// Streams stores a streamed answer as it is relayed, and reads it back.
type Streams interface {
	StreamStart(ctx context.Context, key string, rec *Record, retention, lease time.Duration) (int, error)
	StreamAppend(ctx context.Context, key string, token Token, at int, data []byte, lease time.Duration) (int, error)
	StreamFinish(ctx context.Context, key string, token Token, end StreamEnd, at int) error
	StreamRead(ctx context.Context, key string, from, max int) (StreamPart, error)
}

// Watch wakes a waiter when its key may have changed.
type Watch interface {
	// C receives (at most one pending value) when the key may have been
	// settled or freed, and once when the watch is live.
	C() <-chan struct{}
	// Stop ends the watch.
	Stop()
}

// Span describes the client span of one store operation (the database
// semantic conventions): its name and attributes.
type Span struct {
	Name       string
	Attributes []attribute.KeyValue
}

// Store is a backend as the proxy consumes it: the protocol's operations,
// the Codec that derives its keys and compares fingerprints, and how its
// operations are named in traces (op is the operation's metric label:
// claim, get, renew...).
type Store interface {
	Claims
	Recovery
	Unsent
	Epochs
	Streams
	Codec() *Codec
	Span(op string) Span
}

// Operator is what the binary needs of a backend beyond requests: its
// health, its epochs, whether it is too full for new claims, whether it
// can evict, the key API's reads, and closing it.
type Operator interface {
	// Preload readies the backend for the first requests.
	Preload(ctx context.Context) error
	// Health asks each node the backend writes to how it is.
	Health(ctx context.Context) []MasterHealth
	// CheckEpochs looks at each node's epoch; Lost says one lost its data.
	CheckEpochs(ctx context.Context) ([]Epoch, error)
	// NewEpoch begins a new epoch after a loss on every node, now, as a
	// running sidecar does when it sees one: for a loss that no running
	// sidecar saw (a restore while every sidecar was stopped). Requests
	// first sent before it are refused 412 record-lost.
	NewEpoch(ctx context.Context) ([]Epoch, error)
	// SetFull refuses new claims (ErrFull) while full.
	SetFull(full bool)
	// EvictionPolicy names how the backend drops data under memory
	// pressure; "noeviction" when it never does.
	EvictionPolicy(ctx context.Context) (string, error)
	// Forget deletes key's record when it is in state (ErrStateChanged
	// otherwise): the key API's DELETE.
	Forget(ctx context.Context, key string, state State) error
	// Close ends the backend's subscriptions and connections it owns.
	Close()
}

// Backend is a store as the binary holds it.
type Backend interface {
	Store
	Operator
}

// Up reports whether the master answered.
func (h MasterHealth) Up() bool { return h.Err == nil }

// SendingError is a caller's context ending while its operation's
// commands are still on their way: the backend's client may yet send
// them, or send them again after a broken connection, until Done
// receives.
type SendingError struct {
	Err  error
	Done <-chan struct{}
}

func (e *SendingError) Error() string { return e.Err.Error() }

func (e *SendingError) Unwrap() error { return e.Err }

// StillSending returns, for an error of a store operation whose commands
// may still be sent (its context ended while they were in a pipeline on
// its way), a channel that receives once they no longer can; nil
// otherwise. A claim's cleanup looks for the claim often until then: not
// finding it yet does not mean it will not land.
func StillSending(err error) <-chan struct{} {
	var se *SendingError
	if errors.As(err, &se) {
		return se.Done
	}
	return nil
}
