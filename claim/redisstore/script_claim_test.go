package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestScriptClaim covers the claim script on the embedded store and on
// redis-server, with its script cache flushed first (a restart, a
// failover): a claim, its resend (our own record: claimed), a conflicting
// claim; a new claim's reply carries its key's PTTL and Redis' clock, read
// in its own round trip (mark.go).
func TestScriptClaim(t *testing.T) {
	t.Parallel() // on servers of its own
	e, err := StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for name, addr := range map[string]string{"embedded": e.Addr(), "redis-server": redistest.Start(t).Addr} {
		t.Run(name, func(t *testing.T) {
			c, _ := NewClient(ClientOptions{Addrs: []string{addr}})
			defer c.Close()
			s := New(c, "script:")
			ctx := context.Background()
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			key := s.Codec().Key("alice", "r", "k")
			first := &claim.Record{State: claim.InProgress, Created: time.UnixMilli(1)}
			first.Token[0] = 1
			if res, err := s.Claim(ctx, key, first, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed || res.PTTL <= 0 || res.PTTL > 10*time.Second || res.ServerNow.IsZero() {
				t.Fatalf("claim: %+v %v, want claimed with its PTTL and Redis' clock", res, err)
			}
			if res, err := s.Claim(ctx, key, first, 10*time.Second, claim.Quota{}); err != nil || !res.Claimed {
				t.Fatalf("resent claim: %+v %v, want claimed", res, err)
			}
			second := &claim.Record{State: claim.InProgress, Created: time.UnixMilli(1)}
			second.Token[0] = 2
			res, err := s.Claim(ctx, key, second, 10*time.Second, claim.Quota{})
			if err != nil || res.Claimed || res.Existing.Token != first.Token || res.TTL <= 0 {
				t.Fatalf("conflicting claim: %+v %v, want the first record with its TTL", res, err)
			}
		})
	}
}
