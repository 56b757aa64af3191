package contract

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// The operator's cases: what the binary asks of a backend beyond the
// protocol (Preload, Span), and the options it builds one with, each
// honoured or refused at Preload.

// spanOps are operations the proxy names in its store spans.
var spanOps = []string{"claim", "get", "renew", "complete", "release", "take_over", "free_absent", "stream_append", "stream_end", "stream_read"}

// testPreload: Preload readies the backend, again as often as the binary
// asks (every start, every retry of a start), and claims work after it.
func testPreload(t *testing.T, s claim.Backend) {
	ctx := context.Background()
	for i := range 2 {
		if err := s.Preload(ctx); err != nil {
			t.Fatalf("Preload %d: %v", i+1, err)
		}
	}
	key := s.Codec().Key("alice", "pay", "preloaded")
	if res, err := s.Claim(ctx, key, NewRecord(t), time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim after Preload = %+v, %v", res, err)
	}
}

// testSpans: every operation's span has a name, says which database it
// talks to and which operation it runs, and one span's attributes are its
// own (a later Span never rewrites an earlier one's).
func testSpans(t *testing.T, s claim.Backend) {
	spans := make([]claim.Span, len(spanOps))
	for i, op := range spanOps {
		spans[i] = s.Span(op)
	}
	for i, sp := range spans {
		again := s.Span(spanOps[i])
		if sp.Name == "" || sp.Name != again.Name {
			t.Errorf("Span(%q): name %q, then %q; want one name", spanOps[i], sp.Name, again.Name)
		}
		attrs := map[string]string{}
		for _, a := range sp.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		if attrs["db.system.name"] == "" || attrs["db.operation.name"] == "" {
			t.Errorf("Span(%q) attributes %v: want db.system.name and db.operation.name", spanOps[i], attrs)
		}
		if len(sp.Attributes) != len(again.Attributes) {
			t.Errorf("Span(%q): %d attributes, then %d", spanOps[i], len(sp.Attributes), len(again.Attributes))
			continue
		}
		for j := range sp.Attributes {
			if sp.Attributes[j] != again.Attributes[j] {
				t.Errorf("Span(%q) attribute %d became %v after other spans were made, was %v: spans share their attributes' storage", spanOps[i], j, again.Attributes[j], sp.Attributes[j])
			}
		}
	}
}

// testRefusedOptions: an option a backend takes is honoured, or refused
// by Preload, which the binary runs before it serves: never taken and
// ignored. WithWait asks for more replicas than any deployment has, so a
// backend that honours it reports every claim and completion as
// acknowledged by fewer.
func testRefusedOptions(t *testing.T, d Deployment, _ claim.Backend) {
	ctx := context.Background()
	var short atomic.Int32
	s := d.Open(t, "test:refused:"+t.Name()+":", claim.WithWait(100, 20*time.Millisecond, func(string) { short.Add(1) }))
	if err := s.Preload(ctx); err != nil {
		if !strings.Contains(err.Error(), "WithWait") {
			t.Fatalf("Preload refused the store with %v, which does not name the option it refuses (WithWait)", err)
		}
		return // refused, before anything is served
	}
	rec := NewRecord(t)
	key := s.Codec().Key("alice", "pay", "waited")
	if res, err := s.Claim(ctx, key, rec, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	if short.Load() == 0 {
		t.Fatal("WithWait(100 replicas) taken, not refused by Preload, yet no claim was reported acknowledged by fewer: the option is ignored")
	}
}
