package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// TestReplayCallsNoFunction: a claim that finds a settled record is
// answered by its statement alone (replayFirst), and idem_claim runs only
// for the others. The function is replaced by one that refuses: replays
// still get their record, in both statement modes, and a new key's claim
// reaches the function. Fails with the claim sent as the bare call.
func TestReplayCallsNoFunction(t *testing.T) {
	t.Parallel() // on a server of its own
	pool := namedPool(t)
	ctx := context.Background()
	s := New(pool, "idemproxy", "fast:")
	t.Cleanup(s.Close)
	const key = "fast:settled"
	rec := claimKey(t, s, key)
	if err := completeKey(s, key, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION idemproxy.idem_v3_claim(k text, v bytea, ttl bigint, lim int,
  qkey text, qlimit bigint, qwindow bigint, OUT kind int, OUT cur bytea, OUT pttl bigint, OUT now_ms bigint, OUT len int)
LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'idem_v3_claim was called'; END $$`); err != nil {
		t.Fatal(err)
	}
	retry := &claim.Record{State: claim.InProgress, Created: time.Now()}
	for _, named := range []bool{true, false} {
		s.SetNamed(named)
		res, err := s.Claim(ctx, key, retry, time.Minute, claim.Quota{})
		if err != nil {
			t.Fatalf("named %v: a replay's claim: %v", named, err)
		}
		if res.Claimed || res.Existing == nil || res.Existing.State != claim.Completed || string(res.Existing.Body) != key || res.Existing.Token != rec.Token {
			t.Fatalf("named %v: a replay's claim = %+v, want the settled record", named, res)
		}
		if _, err := s.Claim(ctx, "fast:new", retry, time.Minute, claim.Quota{}); err == nil || !strings.Contains(err.Error(), "idem_v3_claim was called") {
			t.Fatalf("named %v: a new key's claim = %v, want the function's refusal", named, err)
		}
	}
}
