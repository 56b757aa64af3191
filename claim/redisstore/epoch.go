package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/claim"
)

// Data loss, detected. Every master holds an epoch marker under the key
// prefix, without a TTL: "<prefix>epoch" (on a Cluster one per master,
// "<prefix>epoch:{<tag>}" with a tag that hashes into one of its slots).
// Its value is when the epoch began, the later of Redis' clock and its
// creator's (a Redis clock that is behind must not date a loss early),
// and how. A Redis
// that restarted without its data or was flushed has no marker: the first
// look creates a new one (SET NX: once for every sidecar). When the
// process that creates it had seen the previous marker, the store lost
// its data: the epoch is a "lost" one, and every claim whose request was
// first sent before it began may have had a record that is gone, so the
// proxy refuses it (412 record-lost) instead of executing it again. When
// it had not (a new store; or this process started after a loss it cannot
// tell from one), the epoch is a "new" one and refuses nothing: a fresh
// install or an upgrade from a release without markers must not turn the
// retries of its first seconds into 412s.
//
// The marker is looked at before any claim that follows a new connection
// (a restarted Redis breaks every connection, so a claim cannot reach it
// before the look), and by the store watcher every second. A claim that
// carries a first-sent time (Record.ReadEpoch) also reads its master's
// marker in its own round trip, pipelined with the claim: a flush that
// keeps the connections (FLUSHALL, FLUSHDB, an operator's mass DEL) is
// then known to that very claim, not only to the watcher's next look.
//
// What it cannot see: a failover to a replica that missed the last writes,
// or a restore from an older snapshot, keeps a marker (the epoch goes on);
// and a loss while no sidecar that had seen the marker was running is
// taken for a new store.

// epochState is the epochs this process knows, by master.
type epochState struct {
	// mu guards known, markers, checkedDials and checked.
	mu    sync.Mutex
	known map[string]claim.Epoch
	// markers is, on a Cluster, the slot of each master's marker (its
	// lowest range), by master address.
	markers      map[string]int
	checkedDials uint64
	checked      bool
	// gen counts staleEpochs calls: a look that began before one does
	// not make the epochs fresh.
	gen uint64
	// onLoss, when set, is called for each master found without its
	// marker after its epoch was known (the store lost its data).
	onLoss func(e claim.Epoch)
}

// epochKey is the marker's key on a master one of whose slots is slot
// (-1: not a Cluster).
func (s *Store) epochKey(slot int) string {
	if slot < 0 {
		return s.prefix + "epoch"
	}
	return s.prefix + "epoch:{" + slotTag(slot) + "}"
}

// CheckEpochs looks at every master's marker (creating missing ones) and
// returns what it found; the store watcher calls it every second, and a
// claim after a new connection calls it first.
func (s *Store) CheckEpochs(ctx context.Context) ([]claim.Epoch, error) {
	dials := s.dials.Load()
	s.epochs.mu.Lock()
	gen := s.epochs.gen
	s.epochs.mu.Unlock()
	var (
		mu   sync.Mutex
		out  []claim.Epoch
		errs []error
	)
	look := func(ctx context.Context, name string, c redis.Scripter, slot int) {
		e, err := s.lookEpoch(ctx, name, c, slot)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		out = append(out, e)
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		//lint:ignore SA1019 CLUSTER SHARDS needs Redis 7.0; the store supports 6.2 (claim script fallback)
		slots, err := c.ClusterSlots(ctx).Result()
		if err != nil {
			return nil, s.unavailable("epoch", err)
		}
		// The lowest range of each master holds its marker, whatever order
		// Redis lists them in.
		slices.SortFunc(slots, func(a, b redis.ClusterSlot) int { return a.Start - b.Start })
		seen := map[string]bool{}
		for _, r := range slots {
			if len(r.Nodes) == 0 || seen[r.Nodes[0].Addr] {
				continue // one marker per master, in its first range
			}
			addr := r.Nodes[0].Addr
			seen[addr] = true
			s.noteMarker(addr, r.Start)
			node, err := c.MasterForKey(ctx, s.epochKey(r.Start))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			look(ctx, addr, node, r.Start)
		}
	default:
		look(ctx, s.masterLabel(), s.client, -1)
	}
	if len(errs) == 0 {
		s.epochs.mu.Lock()
		s.epochs.checkedDials, s.epochs.checked = dials, s.epochs.gen == gen
		s.epochs.mu.Unlock()
	}
	if len(errs) > 0 {
		return out, s.unavailable("epoch", errors.Join(errs...))
	}
	return out, nil
}

// NewEpoch replaces every master's marker with one that begins a new
// epoch after a loss now (claim.Operator), and looks at them again.
func (s *Store) NewEpoch(ctx context.Context) ([]claim.Epoch, error) {
	if _, err := s.CheckEpochs(ctx); err != nil { // every master's marker known
		return nil, err
	}
	v := strconv.FormatInt(s.clocks.Now().UnixMicro(), 10) + ":lost"
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		s.epochs.mu.Lock()
		starts := slices.Collect(maps.Values(s.epochs.markers))
		s.epochs.mu.Unlock()
		for _, start := range starts {
			err = errors.Join(err, c.Set(ctx, s.epochKey(start), v, 0).Err())
		}
	default:
		err = s.client.Set(ctx, s.epochKey(-1), v, 0).Err()
	}
	if err != nil {
		return nil, s.unavailable("epoch", err)
	}
	return s.CheckEpochs(ctx)
}

// noteMarker records that the master at addr holds its epoch marker in
// the slot range starting at start (a Cluster).
func (s *Store) noteMarker(addr string, start int) {
	s.epochs.mu.Lock()
	defer s.epochs.mu.Unlock()
	if s.epochs.markers == nil {
		s.epochs.markers = map[string]int{}
	}
	s.epochs.markers[addr] = start
}

// lookEpoch reads (or creates) one master's marker and records it.
func (s *Store) lookEpoch(ctx context.Context, name string, c redis.Scripter, slot int) (claim.Epoch, error) {
	s.epochs.mu.Lock()
	_, seen := s.epochs.known[name]
	s.epochs.mu.Unlock()
	kind := "new"
	if seen {
		kind = "lost"
	}
	now := strconv.FormatInt(s.clocks.Now().UnixMicro(), 10)
	v, err := epochScript.Run(ctx, c, []string{s.epochKey(slot)}, kind, now).Slice()
	if err != nil {
		return claim.Epoch{}, err
	}
	if len(v) != 2 {
		return claim.Epoch{}, fmt.Errorf("epoch: unexpected reply %v", v)
	}
	raw, afterLoss := strings.CutSuffix(strings.TrimSpace(fmt.Sprint(v[1])), ":lost")
	us, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return claim.Epoch{}, fmt.Errorf("epoch marker %q: %w", v[1], err)
	}
	e := claim.Epoch{Master: name, Start: time.UnixMicro(us), AfterLoss: afterLoss}
	s.epochs.mu.Lock()
	if s.epochs.known == nil {
		s.epochs.known = map[string]claim.Epoch{}
	}
	prev, seen := s.epochs.known[name]
	// Lost: this process knew an older epoch of this master, which is
	// gone. (A marker another sidecar created first counts too.)
	e.Lost = seen && e.Start.After(prev.Start)
	// This process saw the epoch before it go: whoever created the new
	// marker (a process started since, which could not tell), it follows
	// a loss; and it stays one.
	markedLost := e.AfterLoss
	e.AfterLoss = e.AfterLoss || e.Lost || (seen && prev.Start.Equal(e.Start) && prev.AfterLoss)
	s.epochs.known[name] = e
	observe := s.epochs.onLoss
	s.epochs.mu.Unlock()
	if e.AfterLoss && !markedLost {
		// Tell every process: a sidecar that starts now must not take
		// this epoch for a new store's.
		_ = epochLostScript.Run(ctx, c, []string{s.epochKey(slot)}, raw).Err()
	}
	if observe != nil {
		observe(e)
	}
	return e, nil
}

// EpochStart is when the epoch of key's master began after the store lost
// its data: requests first sent before it may have lost their records.
// It is zero when the epoch is a new store's (nothing lost). Before it is
// known, or after a new connection, it looks.
func (s *Store) EpochStart(ctx context.Context, key string) (time.Time, error) {
	s.epochs.mu.Lock()
	fresh := s.epochs.checked && s.epochs.checkedDials == s.dials.Load()
	s.epochs.mu.Unlock()
	if !fresh {
		if _, err := s.CheckEpochs(ctx); err != nil {
			return time.Time{}, err
		}
	}
	name := s.masterLabel()
	if c, ok := s.client.(*redis.ClusterClient); ok {
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return time.Time{}, s.unavailable("epoch", err)
		}
		name = node.Options().Addr
	}
	s.epochs.mu.Lock()
	defer s.epochs.mu.Unlock()
	if e := s.epochs.known[name]; e.AfterLoss {
		return e.Start, nil
	}
	return time.Time{}, nil
}

// epochRead is the read of key's master's epoch marker that a claim with
// ReadEpoch pipelines with itself, and the master it belongs to; nil when
// the marker's key is not known yet (a Cluster before its first look),
// and the epochs are then looked at again before EpochStart answers.
func (s *Store) epochRead(ctx context.Context, key string) (*redis.StringCmd, string) {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			s.staleEpochs()
			return nil, ""
		}
		addr := node.Options().Addr
		s.epochs.mu.Lock()
		slot, known := s.epochs.markers[addr]
		s.epochs.mu.Unlock()
		if !known {
			s.staleEpochs()
			return nil, ""
		}
		return redis.NewStringCmd(ctx, "get", s.epochKey(slot)), addr
	}
	return redis.NewStringCmd(ctx, "get", s.epochKey(-1)), s.masterLabel()
}

// withEpochRead is a claim's commands, with the read of its master's epoch
// marker after them when rec.ReadEpoch asks for it (epochRead); epoch and
// master go to noteEpochRead once the commands ran.
func (s *Store) withEpochRead(ctx context.Context, key string, rec *claim.Record, cmds ...redis.Cmder) (_ []redis.Cmder, epoch *redis.StringCmd, master string) {
	if !rec.ReadEpoch {
		return cmds, nil, ""
	}
	if epoch, master = s.epochRead(ctx, key); epoch != nil {
		cmds = append(cmds, epoch)
	}
	return cmds, epoch, master
}

// noteEpochRead compares the marker a claim read with the epoch known for
// master: gone, changed or unreadable, the epochs are looked at again
// before EpochStart answers.
func (s *Store) noteEpochRead(master string, read *redis.StringCmd) {
	if read == nil {
		return
	}
	v, err := read.Result()
	s.epochs.mu.Lock()
	known, ok := s.epochs.known[master]
	s.epochs.mu.Unlock()
	if err != nil || !ok {
		s.staleEpochs()
		return
	}
	raw, _ := strings.CutSuffix(strings.TrimSpace(v), ":lost")
	us, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || !time.UnixMicro(us).Equal(known.Start) {
		s.staleEpochs()
	}
}

// staleEpochs has the next EpochStart look at every master's marker.
func (s *Store) staleEpochs() {
	s.epochs.mu.Lock()
	defer s.epochs.mu.Unlock()
	s.epochs.checked = false
	s.epochs.gen++
}

// slotTag is a string whose CRC16 hash slot (Redis Cluster's) is slot,
// found once for every slot.
func slotTag(slot int) string {
	slotTagsOnce.Do(func() {
		found := 0
		for i := 0; found < len(slotTags); i++ {
			t := strconv.Itoa(i)
			if sl := int(crc16([]byte(t)) % 16384); slotTags[sl] == "" {
				slotTags[sl] = t
				found++
			}
		}
	})
	return slotTags[slot]
}

var (
	slotTagsOnce sync.Once
	slotTags     [16384]string
)

// crc16 is CRC-16/XMODEM, Redis Cluster's key hash.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
