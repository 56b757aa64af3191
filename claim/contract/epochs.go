package contract

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// The epoch cases: what a store says when its server lost what it held.

// testEpochLoss: a store's epoch observer hears every epoch its look
// finds, none lost at first; once everything the store held under its
// prefix is gone (Deployment.Lose: a server that lost its data), the next
// look finds an epoch lost and begun after a loss, the observer hears it,
// and EpochStart dates the key's data from it. (The PostgreSQL store once
// told its observer nothing: the data-loss counter never moved there.)
func testEpochLoss(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	prefix := s.Codec().Prefix()
	var mu sync.Mutex
	var heard []claim.Epoch
	o := d.Open(t, prefix, claim.WithEpochObserver(func(e claim.Epoch) {
		mu.Lock()
		heard = append(heard, e)
		mu.Unlock()
	}))
	first, err := o.CheckEpochs(ctx)
	if err != nil || len(first) == 0 {
		t.Fatalf("the first look: %+v, %v", first, err)
	}
	for _, e := range first {
		if e.Lost {
			t.Fatalf("the first look found a loss: %+v", e)
		}
	}
	key := s.Codec().Key("alice", "pay", "epoch")
	if res, err := o.Claim(ctx, key, NewRecord(t), time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim = %+v, %v", res, err)
	}
	if err := d.Lose(ctx, prefix); err != nil {
		t.Fatal(err)
	}
	second, err := o.CheckEpochs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lost := false
	for _, e := range second {
		lost = lost || e.Lost && e.AfterLoss
	}
	if !lost {
		t.Fatalf("the look after the loss: %+v; want an epoch lost, begun after a loss", second)
	}
	mu.Lock()
	heardLoss := false
	for _, e := range heard {
		heardLoss = heardLoss || e.Lost
	}
	n := len(heard)
	mu.Unlock()
	if n != len(first)+len(second) || !heardLoss {
		t.Errorf("the observer heard %d epochs (lost among them: %v); want every one of the %d looked at, the loss among them", n, heardLoss, len(first)+len(second))
	}
	if start, err := o.EpochStart(ctx, key); err != nil || start.IsZero() {
		t.Errorf("EpochStart after the loss = %v, %v; want when the new epoch began", start, err)
	}
}

// testNewEpoch: an operator begins a new epoch by hand (store new-epoch,
// for a loss no running sidecar saw): from a store of its own, as the
// command runs; a running store's next look finds its epoch changed
// (lost, begun after a loss, now), and EpochStart dates the key's data
// from it.
func testNewEpoch(t *testing.T, d Deployment, s claim.Backend) {
	ctx := context.Background()
	prefix := s.Codec().Prefix()
	running := d.Open(t, prefix)
	if _, err := running.CheckEpochs(ctx); err != nil {
		t.Fatal(err)
	}
	key := s.Codec().Key("alice", "pay", "epoch")
	if start, err := running.EpochStart(ctx, key); err != nil || !start.IsZero() {
		t.Fatalf("EpochStart before any loss = %v, %v; want zero", start, err)
	}
	before := time.Now().Add(-time.Second)
	operator := d.Open(t, prefix)
	began, err := operator.NewEpoch(ctx)
	if err != nil || len(began) == 0 {
		t.Fatalf("NewEpoch = %+v, %v", began, err)
	}
	for _, e := range began {
		if !e.AfterLoss || e.Start.Before(before) {
			t.Errorf("NewEpoch began %+v; want an epoch after a loss, begun now", e)
		}
	}
	seen, err := running.CheckEpochs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range seen {
		if !e.Lost || !e.AfterLoss || e.Start.Before(before) {
			t.Errorf("the running store's look after NewEpoch: %+v; want its epoch lost, the new one begun now after a loss", e)
		}
	}
	if start, err := running.EpochStart(ctx, key); err != nil || start.Before(before) {
		t.Errorf("EpochStart after NewEpoch = %v, %v; want when the new epoch began", start, err)
	}
}
