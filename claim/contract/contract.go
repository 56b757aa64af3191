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
	"net/http"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Factory opens a store for one case, on the deployment under test, with
// every key under prefix (each case has a prefix of its own) and opts.
// It closes what it opened when t ends.
type Factory func(t *testing.T, prefix string, opts ...claim.Option) claim.Backend

// Case is one contract case.
type Case struct {
	Name string
	Run  func(t *testing.T, s claim.Backend)
}

// Cases are the contract, in the order they run.
var Cases = []Case{
	{"ClaimThenConflict", testClaimThenConflict},
	{"ResentClaimIsOurs", testResentClaimIsOurs},
	{"CompleteAndGet", testCompleteAndGet},
	{"ResentCompleteIsSuccess", testResentCompleteIsSuccess},
	{"RenewFenced", testRenewFenced},
	{"ReleaseFenced", testReleaseFenced},
	{"StaleOwnerAfterTakeover", testStaleOwnerAfterTakeover},
	{"LeaseLapses", testLeaseLapses},
	{"CompleteAfterLapse", testCompleteAfterLapse},
	{"ConcurrentClaimsOneWinner", testConcurrentClaims},
	{"ConcurrentPairsKeepTheirResults", testConcurrentPairs},
	{"WatchWakesOnEverySettlement", testWatch},
	{"TailOutlivesLease", testTailOutlivesLease},
	{"SettleOrphanFenced", testSettleOrphanFenced},
	{"FullRefusesOnlyNewClaims", testFullRefusesOnlyNewClaims},
	{"Quota", testQuota},
	{"UnforwardedClaims", testUnforwardedClaims},
	{"TakeOverFenced", testTakeOverFenced},
	{"StreamedRecords", testStreamedRecords},
}

// Run runs every case in parallel, each on a store open gives it under a
// prefix of its own ("test:<name>:").
func Run(t *testing.T, open Factory) {
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			c.Run(t, open(t, "test:"+t.Name()+":"))
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
