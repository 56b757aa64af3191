package proxy_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestFirstSent (issue 33): a request that says when it was first sent
// (Repeatability-First-Sent, or a UUIDv7 key) and finds no record is
// refused 412, nothing forwarded and the key left free, when it was first
// sent longer ago than the retention (key-expired) or before the store's
// epoch began (record-lost: the store lost its data then), each within
// first_sent_skew; a request first sent since executes as before, and one
// whose record exists is replayed whatever its first-sent time. A
// malformed first-sent time is 400.
func TestFirstSent(t *testing.T) {
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].Retention = time.Hour
		c.Routes[0].FirstSent = []proxy.FirstSentSource{proxy.FirstSentHeader, proxy.FirstSentUUIDv7}
		c.Routes[0].FirstSentSkew = 2 * time.Second
	})
	// An epoch that began 3h ago: the store has not lost anything since.
	ctx := context.Background()
	if err := e.rdb.Set(ctx, e.prefix+"epoch", time.Now().Add(-3*time.Hour).UnixMicro(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	sent := func(ago time.Duration) map[string]string {
		return map[string]string{"Repeatability-First-Sent": time.Now().Add(-ago).UTC().Format(http.TimeFormat)}
	}
	if r := e.do(req{user: "alice", key: "fresh", body: `{}`, header: sent(0)}); r.status != http.StatusCreated {
		t.Fatalf("first sent now: %d %s, want 201", r.status, r.body)
	}
	// A first-sent time further ahead than the skew (issue 41: year 9999
	// switched the check off for that request) is 400, nothing forwarded.
	for _, future := range []map[string]string{sent(-time.Hour), {"Repeatability-First-Sent": "Fri, 31 Dec 9999 23:59:59 GMT"}} {
		before := e.ledger.Total()
		if r := e.do(req{user: "alice", key: "future", body: `{}`, header: future}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "first-sent-invalid") || e.ledger.Total() != before {
			t.Fatalf("first sent %v: %d %s (executions %d → %d), want 400 first-sent-invalid, nothing forwarded", future, r.status, r.body, before, e.ledger.Total())
		}
	}
	if r := e.do(req{user: "alice", key: "slightly-ahead", body: `{}`, header: sent(-time.Second)}); r.status != http.StatusCreated {
		t.Fatalf("first sent 1s ahead (within the skew): %d %s, want 201", r.status, r.body)
	}
	if r := e.do(req{user: "alice", key: "fresh", body: `{}`, header: sent(2 * time.Hour)}); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a record that exists is replayed whatever the first-sent time: %d %s", r.status, r.body)
	}
	if r := e.do(req{user: "alice", key: "old", body: `{}`, header: sent(61 * time.Minute)}); r.status != http.StatusPreconditionFailed || !strings.Contains(r.body, "key-expired") {
		t.Fatalf("first sent 61 min ago, retention 1h, no record: %d %s, want 412 key-expired", r.status, r.body)
	}
	if r := e.do(req{user: "alice", key: "edge", body: `{}`, header: sent(time.Hour + time.Second)}); r.status != http.StatusCreated {
		t.Fatalf("first sent 1h1s ago, within the 2s skew: %d %s, want 201", r.status, r.body)
	}
	// The store loses its data (the marker goes with it): a new epoch
	// begins at the next look, and requests first sent before it have
	// lost their records.
	if err := e.rdb.Del(ctx, e.prefix+"epoch").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.CheckEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	epoch, err := e.store.EpochStart(ctx, e.store.Codec().Key("alice", proxy.KeyScope("pay", false), "x"))
	if err != nil || time.Since(epoch) > time.Minute {
		t.Fatalf("epoch after the loss: %v %v, want about now", epoch, err)
	}
	before := map[string]string{"Repeatability-First-Sent": epoch.Add(-time.Minute).UTC().Format(http.TimeFormat)}
	if r := e.do(req{user: "alice", key: "lost", body: `{}`, header: before}); r.status != http.StatusPreconditionFailed || !strings.Contains(r.body, "record-lost") {
		t.Fatalf("first sent before the epoch, no record: %d %s, want 412 record-lost", r.status, r.body)
	}
	skewed := map[string]string{"Repeatability-First-Sent": epoch.Add(-time.Second).UTC().Format(http.TimeFormat)}
	if r := e.do(req{user: "alice", key: "skewed", body: `{}`, header: skewed}); r.status != http.StatusCreated {
		t.Fatalf("first sent 1s before the epoch, within the skew: %d %s, want 201", r.status, r.body)
	}
	// A UUIDv7 key carries its own first-sent time.
	old := uuidv7(time.Now().Add(-2 * time.Hour))
	if r := e.do(req{user: "alice", key: old, body: `{}`}); r.status != http.StatusPreconditionFailed || !strings.Contains(r.body, "key-expired") {
		t.Fatalf("a UUIDv7 key from 2h ago: %d %s, want 412 key-expired", r.status, r.body)
	}
	if r := e.do(req{user: "alice", key: uuidv7(time.Now()), body: `{}`}); r.status != http.StatusCreated {
		t.Fatalf("a UUIDv7 key from now: %d %s, want 201", r.status, r.body)
	}
	for _, bad := range []string{"yesterday", "2026-12-01T10:00:00Z"} {
		if r := e.do(req{user: "alice", key: "bad", body: `{}`, header: map[string]string{"Repeatability-First-Sent": bad}}); r.status != http.StatusBadRequest || !strings.Contains(r.body, "first-sent-invalid") {
			t.Errorf("first-sent %q: %d %s, want 400 first-sent-invalid", bad, r.status, r.body)
		}
	}
	// Nothing refused was forwarded, and its key stays free.
	if n := e.ledger.Total(); n != 5 {
		t.Errorf("upstream executed %d times, want 5 (fresh, slightly-ahead, edge, skewed, the new UUIDv7)", n)
	}
	if r := e.do(req{user: "alice", key: "old", body: `{}`, header: sent(0)}); r.status != http.StatusCreated {
		t.Errorf("the refused key, sent again as new: %d, want 201 (the 412 left it free)", r.status)
	}
	for reason, want := range map[string]float64{"key-expired": 2, "record-lost": 1} {
		if got := e.counter("idemproxy_first_sent_refused_total", map[string]string{"route": "pay", "reason": reason}); got != want {
			t.Errorf("idemproxy_first_sent_refused_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

// uuidv7 is a UUIDv7 for time t (random bits fixed: tests only).
func uuidv7(t time.Time) string {
	ms := uint64(t.UnixMilli())
	b := []byte{byte(ms >> 40), byte(ms >> 32), byte(ms >> 24), byte(ms >> 16), byte(ms >> 8), byte(ms), 0x70, 0x01, 0x80, 0x02, 3, 4, 5, 6, 7, 8}
	const hexd = "0123456789abcdef"
	var s strings.Builder
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s.WriteByte('-')
		}
		s.WriteByte(hexd[c>>4])
		s.WriteByte(hexd[c&15])
	}
	return s.String()
}

// flakyStore fails the next EpochStart and Release it is asked for, as a
// store that went away between a claim and the calls after it.
type flakyStore struct {
	proxy.Store
	epoch, release atomic.Int32
}

func (s *flakyStore) EpochStart(ctx context.Context, key string) (time.Time, error) {
	if s.epoch.Add(-1) >= 0 {
		return time.Time{}, claim.Unavailable("epoch", errors.New("terminating connection due to unexpected postmaster exit"))
	}
	return s.Store.EpochStart(ctx, key)
}

func (s *flakyStore) Release(ctx context.Context, key string, token claim.Token) error {
	if s.release.Add(-1) >= 0 {
		return claim.Unavailable("release", errors.New("connection refused"))
	}
	return s.Store.Release(ctx, key, token)
}

// TestClaimFreedWhenTheEpochCannotBeRead: a request that says when it
// was first sent claims its key, then the store cannot say its epoch and
// the claim's release fails too (the store went away for a moment):
// nothing was forwarded, so the claim is deleted in the background once
// the store answers, and the retry after its lease executes, once,
// instead of being answered 502 outcome-unknown for a request that never
// ran (chaos -store postgres found it: a claim left by a release that
// failed, under unknown_outcome: fail).
func TestClaimFreedWhenTheEpochCannotBeRead(t *testing.T) {
	flaky := &flakyStore{}
	e := newEnv(t, created, func(c *setup) {
		c.Routes[0].Lease = time.Second
		c.Routes[0].Unknown = proxy.Fail
		c.Routes[0].FirstSent = []proxy.FirstSentSource{proxy.FirstSentHeader}
		c.WrapStore = func(s proxy.Store) proxy.Store { flaky.Store = s; return flaky }
	})
	flaky.epoch.Store(1)
	flaky.release.Store(1)
	sent := map[string]string{"Repeatability-First-Sent": time.Now().UTC().Format(http.TimeFormat)}
	if r := e.do(req{user: "alice", key: "k", body: `{}`, header: sent}); r.status != http.StatusServiceUnavailable || e.ledger.Total() != 0 {
		t.Fatalf("epoch unreadable: %d %s (executions %d), want 503, nothing forwarded", r.status, r.body, e.ledger.Total())
	}
	time.Sleep(1200 * time.Millisecond) // past the claim's lease
	if r := e.do(req{user: "alice", key: "k", body: `{}`, header: sent}); r.status != http.StatusCreated || e.ledger.Total() != 1 {
		t.Fatalf("the retry after the lease: %d %s (executions %d), want 201 and one execution", r.status, r.body, e.ledger.Total())
	}
}
