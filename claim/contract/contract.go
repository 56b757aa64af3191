// Package contract is the behaviour every claim backend owes the proxy,
// as one suite: a backend's test runs it with a factory of its own
// (Run), on each deployment it supports. A new backend is a package under
// claim/ whose Store implements claim.Backend, plus a test that calls Run.
//
// Every case talks to the store through claim.Backend alone. The cases
// that need a backend's own tools (its raw values, its clock, its
// topology) live beside that backend, each named there.
package contract

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Deployment is one deployment of a backend under test: a backend's test
// gives one per deployment it supports (a server, a cluster...).
type Deployment interface {
	// Open opens a store on the deployment, every key under prefix, with
	// opts (several stores on one prefix read each other's records). It
	// closes what it opened when t ends.
	Open(t *testing.T, prefix string, opts ...claim.Option) claim.Backend
	// Raw is key's value as stored, byte for byte; nil when the key holds
	// nothing.
	Raw(ctx context.Context, key string) ([]byte, error)
	// Plant stores value under key as it is, for ttl: a record written
	// by hand (another program's, an older release's, an edited one).
	Plant(ctx context.Context, key string, value []byte, ttl time.Duration) error
	// Lose deletes everything the store holds under prefix, its epoch
	// markers too: a server that lost its data.
	Lose(ctx context.Context, prefix string) error
}

// Case is one contract case: s is a store Open made for it, under a
// prefix of its own.
type Case struct {
	Name string
	Run  func(t *testing.T, d Deployment, s claim.Backend)
}

// on is a case that needs nothing but its store.
func on(run func(t *testing.T, s claim.Backend)) func(*testing.T, Deployment, claim.Backend) {
	return func(t *testing.T, _ Deployment, s claim.Backend) { run(t, s) }
}

// Cases are the contract, in the order they run.
var Cases = []Case{
	{"ClaimThenConflict", on(testClaimThenConflict)},
	{"ResentClaimIsOurs", on(testResentClaimIsOurs)},
	{"CompleteAndGet", on(testCompleteAndGet)},
	{"ResentCompleteIsSuccess", on(testResentCompleteIsSuccess)},
	{"RenewFenced", on(testRenewFenced)},
	{"ReleaseFenced", on(testReleaseFenced)},
	{"StaleOwnerAfterTakeover", on(testStaleOwnerAfterTakeover)},
	{"LeaseLapses", on(testLeaseLapses)},
	{"CompleteAfterLapse", on(testCompleteAfterLapse)},
	{"ConcurrentClaimsOneWinner", on(testConcurrentClaims)},
	{"ConcurrentPairsKeepTheirResults", on(testConcurrentPairs)},
	{"WatchWakesOnEverySettlement", on(testWatch)},
	{"TailOutlivesLease", on(testTailOutlivesLease)},
	{"SettleOrphanFenced", on(testSettleOrphanFenced)},
	{"FullRefusesOnlyNewClaims", on(testFullRefusesOnlyNewClaims)},
	{"Quota", on(testQuota)},
	{"UnforwardedClaims", on(testUnforwardedClaims)},
	{"TakeOverFenced", on(testTakeOverFenced)},
	{"StreamedRecords", on(testStreamedRecords)},
	{"ForeignValueNeverTouched", testForeignValue},
	{"UnforwardedWhateverTheReadersClock", testUnforwardedReadersClock},
	{"UnmarkedWhileTheClockIsOff", testUnmarkedWhileClockOff},
	{"OwnRoundTripDecides", testOwnRoundTripDecides},
	{"CompressedRecords", testCompressedRecords},
	{"CompactRecords", testCompactRecords},
	{"KeyedFingerprints", testKeyedFingerprints},
	{"SealedRecords", testSealedRecords},
	{"KeyRotation", testKeyRotation},
	{"SecretKeyDerivation", testSecretKeyDerivation},
	{"SealingRequired", testSealingRequired},
	{"TakeOverFencedOnExpiry", testTakeOverFencedOnExpiry},
	{"EpochLoss", testEpochLoss},
	{"NewEpoch", testNewEpoch},
	{"Preload", on(testPreload)},
	{"Spans", on(testSpans)},
	{"RefusedOptions", testRefusedOptions},
	{"SealedStreams", testSealedStreams},
}

// Run runs every case on d in parallel, each on a store d opens for it
// under a prefix of its own ("test:<name>:").
func Run(t *testing.T, d Deployment) {
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			c.Run(t, d, d.Open(t, "test:"+t.Name()+":"))
		})
	}
}

// NewRecord is a fresh in-progress record with a token of its own.
func NewRecord(t *testing.T) *claim.Record {
	t.Helper()
	r := &claim.Record{State: claim.InProgress, Created: time.UnixMilli(1_700_000_000_000), RequestID: "req-1"}
	rand.Read(r.Token[:])
	r.Fingerprint[0] = 7
	return r
}

// StartedStream claims key for a new record and starts its streamed
// answer (200, an hour's retention, a minute's lease): the owner's head
// and the length to append at.
func StartedStream(t *testing.T, s claim.Backend, key string) (claim.Record, int) {
	t.Helper()
	head := claimedHead(t, s, key)
	at, err := s.StreamStart(context.Background(), key, &head, time.Hour, time.Minute)
	if err != nil {
		t.Fatalf("StreamStart = %d, %v", at, err)
	}
	return head, at
}

// claimedHead claims key for a new record and returns the head of its
// streamed answer (200, text/event-stream), not started yet.
func claimedHead(t *testing.T, s claim.Backend, key string) claim.Record {
	t.Helper()
	owner := NewRecord(t)
	if res, err := s.Claim(context.Background(), key, owner, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	head := *owner
	head.State, head.Status = claim.Streamed, 200
	head.Header = http.Header{"Content-Type": {"text/event-stream"}}
	return head
}

// Completed is r completed with a 201, two headers and body.
func Completed(r *claim.Record, body string) *claim.Record {
	c := *r
	c.State = claim.Completed
	c.Completed = r.Created.Add(time.Second)
	c.Status = 201
	c.Header = http.Header{"Content-Type": {"application/json"}, "X-Charge": {"a", "b"}}
	c.Body = []byte(body)
	return &c
}

// whileLive runs try, a case's steps that claim a key with lease and then
// act on the claim as a live one, on fresh keys until one try ran within
// the lease, and returns that key; try returns the checks of what it
// saw, which run only then. A try that took the whole lease (a loaded
// machine's scheduler can outlast 200 ms) says nothing of the store: its
// claim may have lapsed before the steps that count on it ran.
func whileLive(t *testing.T, s claim.Backend, lease time.Duration, try func(key string) (check func())) string {
	t.Helper()
	for i := range 20 {
		key := s.Codec().Key("alice", "route", fmt.Sprintf("live-%d", i))
		start := time.Now()
		check := try(key)
		if time.Since(start) < lease {
			check()
			return key
		}
	}
	t.Fatalf("20 tries each took longer than their %s lease", lease)
	return ""
}

// WaitClaimed claims key for rec, retrying while a lease that is about
// to lapse still holds it.
func WaitClaimed(t *testing.T, s claim.Backend, key string, rec *claim.Record, lease time.Duration) {
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

// Planter is what a backend offers its tests beyond claim.Backend: it
// writes a claim as if its reply never reached its owner (the SET ran
// late: rec.Created long before the store's now).
type Planter interface {
	PlantUnconfirmed(ctx context.Context, key string, rec *claim.Record, lease time.Duration) error
}

// planter is s as a Planter; a backend without one fails the case.
func planter(t *testing.T, s claim.Backend) Planter {
	t.Helper()
	p, ok := s.(Planter)
	if !ok {
		t.Fatalf("%T does not implement contract.Planter", s)
	}
	return p
}
