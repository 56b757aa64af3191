package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// The store's epochs (claim.Epochs): a marker row that a loss replaces,
// the server the records live on, and a watermark in the records table
// that every look raises and each sidecar remembers (idem_epoch in
// schema.sql). A claim that says when its request was first sent reads
// all three in its own transaction (readEpochWith), so that a loss is
// seen in the round trip that would otherwise execute the retry again.

// CheckEpochs reads the store's epoch marker, creating it when missing,
// with the server it lives on and the records' watermark (idem_epoch):
// one that this process saw and is gone means the data was lost (a
// truncation, a restore of the markers), and so does a server that changed
// under it in a way that can lose acknowledged writes (another system
// identifier; another timeline on a server that was not a synchronous
// standby; the records' own marker row gone; the records' watermark below
// the highest this process saw: an older copy restored): the new epoch
// begins after a loss. The store's epoch observer hears of every look.
func (s *Store) CheckEpochs(ctx context.Context) ([]claim.Epoch, error) {
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	e, err := s.look(ctx)
	if err != nil {
		return nil, err
	}
	return []claim.Epoch{e}, nil
}

// look is CheckEpochs' look, checkMu held. A claim's note of a stale
// epoch (noteEpochRead) from its start on asks for the next look: this
// one may have read the store before what the claim saw.
func (s *Store) look(ctx context.Context) (claim.Epoch, error) {
	s.epochMu.Lock()
	seenEpoch, watermark := s.epochSeen, s.watermark
	s.epochStale = false
	s.looks++
	n := s.looks
	s.epochMu.Unlock()
	now := strconv.FormatInt(s.clocks.Now().UnixMicro(), 10)
	mark := now
	var seenArg *string
	if seenEpoch != "" {
		mark += ":lost"
		seenArg = &seenEpoch
	}
	var v string
	var why *string
	var seen, started int64
	prefix := s.codec.Prefix()
	if err := s.row(ctx, "epoch", "idem_epoch", []any{prefix + "epoch", mark, prefix + "epoch:server", now + ":lost", watermark, seenArg}, &v, &why, &seen, &started); err != nil {
		s.staleEpoch()
		return claim.Epoch{}, err
	}
	if s.lookRead != nil {
		s.lookRead()
	}
	e := claim.Epoch{Master: s.node, AfterLoss: strings.HasSuffix(v, ":lost")}
	us, err := strconv.ParseInt(strings.TrimSuffix(v, ":lost"), 10, 64)
	if err != nil {
		s.staleEpoch()
		return claim.Epoch{}, fmt.Errorf("claim: epoch marker %q: %w", v, err)
	}
	e.Start = time.UnixMicro(us)
	e.Lost = seenEpoch != "" && seenEpoch != v || why != nil
	if why != nil {
		e.Reason = *why
	}
	s.epochMu.Lock()
	s.epochSeen, s.epochAt, s.epochChecked, s.epochServer, s.looked = v, e, time.Now(), started, n
	if e.Lost || seen > s.watermark {
		// After a loss, or a new epoch another sidecar began, the
		// watermark is the store's again: what was seen before it is
		// gone with the records.
		s.watermark = seen
	}
	s.epochMu.Unlock()
	if s.onEpoch != nil {
		s.onEpoch(e)
	}
	return e, nil
}

// NewEpoch replaces the epoch marker with one that begins a new epoch
// after a loss now (claim.Operator), and looks at it again: the running
// sidecars take it for an epoch another began after a loss.
func (s *Store) NewEpoch(ctx context.Context) ([]claim.Epoch, error) {
	v := strconv.FormatInt(s.clocks.Now().UnixMicro(), 10) + ":lost"
	_, err := s.pool.Exec(ctx, "INSERT INTO "+s.schema+".markers (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value", s.codec.Prefix()+"epoch", v)
	if err != nil {
		return nil, s.unavailable("epoch", err)
	}
	return s.CheckEpochs(ctx)
}

// epochFresh is how long a look at the epoch stands for EpochStart, when
// no claim's read of the marker and no failed call asked for another.
const epochFresh = time.Second

// noteEpochRead compares the marker a claim read in its own round trip,
// and the start of the server it read it on, with the ones this process
// last looked at: another marker, or another server (restarted, restored,
// failed over: its pool's new connections say nothing), asks EpochStart
// for a new look before it answers.
func (s *Store) noteEpochRead(read epochRead) {
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	if read.marker != s.epochSeen || read.started != s.epochServer || read.watermark < read.expect {
		s.epochStale = true
	}
}

// epochRead is what a claim read of the epoch in its own transaction: the
// marker ("" when none), when the server's postmaster started, and the
// records' watermark (-1 when its row is gone); expect is the watermark
// this process knew committed before the claim was sent, the least its
// transaction can read. Not the one known when the answer comes back: a
// look at the epoch that raised the watermark while the claim was in
// flight is not a loss, and taking it for one had every first-sent claim
// under load ask for another look, which raised the watermark again
// (0.45x the first attempts without the header, measured).
type epochRead struct {
	marker    string
	started   int64
	watermark int64
	expect    int64
}

// knownWatermark is the highest records' watermark this process knows
// committed.
func (s *Store) knownWatermark() int64 {
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	return s.watermark
}

// watermarkOf is the watermark the records' server row holds (v, its
// value: epoch, or epoch:N); -1 when the row is gone or unreadable.
func watermarkOf(v *string) int64 {
	if v == nil {
		return -1
	}
	if *v == "epoch" {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(*v, "epoch:"), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// staleEpoch has the next EpochStart look at the epoch again: a call
// failed, and the server may not be the one last looked at.
func (s *Store) staleEpoch() {
	s.epochMu.Lock()
	s.epochStale = true
	s.epochMu.Unlock()
}

// EpochStart is when the data key lives in began, when it began after a
// loss; zero otherwise. Callers that find the epoch stale together share
// one look: the first to get its turn looks, and the others take that
// look, which began after they asked.
func (s *Store) EpochStart(ctx context.Context, key string) (time.Time, error) {
	s.epochMu.Lock()
	e, fresh, asked := s.epochAt, s.freshEpoch(), s.looks
	s.epochMu.Unlock()
	if !fresh {
		s.checkMu.Lock()
		s.epochMu.Lock()
		e, fresh = s.epochAt, s.freshEpoch() && s.looked > asked
		s.epochMu.Unlock()
		var err error
		if !fresh {
			e, err = s.look(ctx)
		}
		s.checkMu.Unlock()
		if err != nil {
			return time.Time{}, err
		}
	}
	if e.AfterLoss {
		return e.Start, nil
	}
	return time.Time{}, nil
}

// freshEpoch is whether the last look stands, epochMu held: nothing asked
// for another since it began, and it is less than epochFresh old.
func (s *Store) freshEpoch() bool {
	return !s.epochStale && s.epochSeen != "" && time.Since(s.epochChecked) < epochFresh
}
