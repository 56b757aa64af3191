package proxy

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// TestFrontWithoutAnHTTPRequest (issue 66): a front that is not an HTTP
// request (a gRPC call, an Envoy ext_proc message) serves a key through
// the attempt alone: it claims, forwards through a function it is given,
// renews, settles and answers; its retry replays the stored answer, and
// a retry while it runs is told so. Nothing here builds an
// *http.Request.
func TestFrontWithoutAnHTTPRequest(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Routes = []Route{testRoute("pay", "POST /payments")}
	h, err := New(cfg, embeddedStore(t, "front:"), Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rt := h.routes.Load().byName["pay"]
	body := []byte(`{"amount":1250}`)
	fp := rt.fp.sum("POST", "/payments", "", http.Header{}, body)

	// serve is the whole front: the attempt decides, or it owns the key
	// and forwards through forward, renewing while it runs.
	executed := 0
	serve := func(requestID string, forward func(*holding) (int, []byte)) *reply {
		a := h.newAttempt(context.Background(), rt, "alice", requestID)
		a.at("order-42")
		rec := a.newClaim(fp)
		held, rep := a.ownOrAnswer(rec, body, nil)
		if held == nil {
			return rep
		}
		defer held.slot.give()
		status, answer := forward(held)
		done := settledRecord(rec, rec.Token, claim.Completed, status, http.Header{"Content-Type": {"application/json"}}, h.now())
		done.Body = answer
		v := held.complete(done)
		return &reply{outcome: v.outcome, detail: v.detail, record: done}
	}

	var during *reply
	first := serve("req-1", func(held *holding) (int, []byte) {
		executed++
		if !held.renew() {
			t.Error("renewing the claim it holds: lost")
		}
		during = serve("req-2", func(*holding) (int, []byte) {
			executed++
			return 500, nil
		})
		return http.StatusCreated, []byte(`{"id":"ch_1"}`)
	})
	if first.outcome != outcomeStored || first.record == nil || first.record.Status != http.StatusCreated {
		t.Fatalf("first attempt: %+v, want stored 201", first)
	}
	if during == nil || during.outcome != outcomeConflict || during.problem.Status != http.StatusConflict {
		t.Fatalf("a retry while the first ran: %+v, want 409 conflict", during)
	}
	again := serve("req-3", func(*holding) (int, []byte) {
		executed++
		return 500, nil
	})
	if again.outcome != outcomeReplayed || !again.replayed || again.record == nil ||
		again.record.Status != http.StatusCreated || !bytes.Equal(again.record.Body, []byte(`{"id":"ch_1"}`)) || again.record.RequestID != "req-1" {
		t.Fatalf("the retry: %+v, want the first answer replayed", again)
	}
	if executed != 1 {
		t.Fatalf("forwarded %d times, want once", executed)
	}

	// A settlement that frees the key: the next attempt executes.
	a := h.newAttempt(context.Background(), rt, "alice", "req-5")
	a.at("order-43")
	rec := a.newClaim(fp)
	held, rep := a.ownOrAnswer(rec, body, nil)
	if held == nil {
		t.Fatalf("a new key: %+v, want it owned", rep)
	}
	v := held.release("the upstream said 503")
	held.slot.give()
	if v.outcome != outcomeReleased {
		t.Fatalf("release: %+v", v)
	}
	b := h.newAttempt(context.Background(), rt, "alice", "req-6")
	b.at("order-43")
	if held, rep := b.ownOrAnswer(b.newClaim(fp), body, nil); held == nil {
		t.Fatalf("the key released: %+v, want the retry to own it", rep)
	} else {
		held.slot.give()
	}
}

// embeddedStore is a store on the embedded Redis (miniredis), for the
// unit tests and benchmarks of what runs above the store, its keys under
// prefix.
func embeddedStore(tb testing.TB, prefix string) *redisstore.Store {
	tb.Helper()
	emb, err := redisstore.StartEmbedded()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(emb.Close)
	client, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{emb.Addr()}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	store := redisstore.New(client, prefix)
	tb.Cleanup(store.Close)
	return store
}
