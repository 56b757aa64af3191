package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/claim"
)

// streamPump relays one streamed answer for its owner. One goroutine at a
// time pumps (reads the upstream, stores what it read, hands it on): the
// owner's client's own, inside Read, while it keeps up, so an event costs
// that goroutine one read, one append and one write, as ReverseProxy's
// copy does plus the store's round trip; a goroutine of the pump's own
// (background) once that client has not come back to Read for
// streamTakeover, or went away. Renewals run on a timer of their own
// (renewDue), serialized with the appends, which nothing a client does
// can hold back.
//
// Lock order: storeMu, then mu; never the other way. What holds mu and
// needs the store lets mu go first (pumpTurn around pump, readBack around
// its read); hand and end take mu inside storeMu.
//
// Turns, all under mu:
//   - pumping says a goroutine has the turn; one turn is one pump: one
//     read of the upstream, the append of what it brought, and its hand
//     to the client. Nobody else reads the upstream meanwhile.
//   - The owner's client takes the turn inside Read, when it has nothing
//     to take, the stream runs and nobody pumps; otherwise it waits on
//     cond (out grew, a turn ended, the stream ended).
//   - background takes turns while the client is not inside Read
//     (reading false): the takeover timer starts it streamTakeover after
//     the stream started or the client last took a part, and at once
//     when the client Closes. Between two turns it looks again, and gives
//     the turns back as soon as the client waits in Read.
//   - renewDue never pumps: it holds storeMu only, so a renewal waits at
//     most for one append.
//   - Once the stream ended (outDone) nobody takes a turn, and done closes
//     when the last turn is over (finishLocked): past it nothing of the
//     pump touches the exchange, and wait returns how the stream ended.
type streamPump struct {
	o     *owner
	body  io.ReadCloser // the upstream's
	start time.Time
	buf   *[streamReadBuf]byte // the read buffer, the pumping goroutine's (no coalescer), from readBufs
	// coalesce, on a route with a stream_flush_interval, reads the
	// upstream and gives the pump at most one part per interval.
	coalesce *coalescer

	// storeMu serializes what is written to the store: appends, renewals
	// and the end, and the fields below.
	storeMu   sync.Mutex
	at        int // the stored value's length
	lastWrite time.Time
	ended     bool
	// how is how the stream ended for every reader (end), read by wait
	// once done is closed; detail, when set, what the request's line says
	// of it, and unknown why the call's outcome is unknown (it broke off).
	how             claim.StreamEnd
	detail, unknown string
	stored          int64
	first           bool
	tooBig          bool
	renew           *time.Timer
	// call is the context appends and renewals run on, made again once
	// less than half of settleTimeout is left of it (callCtx); done with
	// it, end cancels it.
	call       context.Context
	callCancel context.CancelFunc
	callEnds   time.Time
	// chunks is idemproxy_stream_chunks_total's series of the route.
	chunks prometheus.Counter

	mu      sync.Mutex
	cond    *sync.Cond // signals out's growth and room, pumping's end
	pumping bool       // a goroutine reads the upstream (one at a time)
	reading bool       // the owner's client is in Read
	out     []byte     // stored, not yet taken by the owner's client
	outErr  error      // set with outDone: io.EOF, or errStreamAborted
	outDone bool
	gone    bool // the owner's client went away: out is not kept
	closed  bool // done is closed
	// storedTo is the stored value's length as the pump last appended;
	// lagging says the owner's client fell more than streamPending behind
	// and reads the rest from the store, from lagFrom on: the pump never
	// waits for it (a slow client never holds the upstream back, nor the
	// renewals).
	storedTo, lagFrom int
	lagging, lagged   bool        // lagged: it ever lagged
	takeover          *time.Timer // runs background
	// left is when the owner's client last left Read with a part, and
	// armed says takeover is set. Read does not move the timer for every
	// part (a timer moved may wake an idle thread of the runtime's: 0.4 of
	// the 7.4 thread wake-ups per event bench stream counted); when it
	// fires, background sets it again for the rest of streamTakeover
	// after left, as renewDue does with lastWrite. look is how long it
	// waits to look again when it found the client in Read: doubled each
	// time (up to streamLookMax), back to streamTakeover once it finds it
	// away. A timer that fires every streamTakeover however well the
	// client keeps up cost bench stream 0.3 thread wake-ups per event: its
	// goroutine, its own wake-up, and every deadline moved after it.
	left  time.Time
	armed bool
	look  time.Duration
	done  chan struct{}
	// rc is the owner's client's connection, whose write deadline each
	// part handed to it renews (client.write_timeout).
	rc *http.ResponseController
}

// streamTakeover is how long the owner's client may be away from Read
// (writing what it took) before the pump reads the upstream without it;
// a client that kept up until then is found away within streamLookMax
// more at most.
const (
	streamTakeover = 10 * time.Millisecond
	streamLookMax  = 80 * time.Millisecond
)

// startStream begins relaying resp, a stream, as its owner: the head is
// stored in place of the claim, and resp's body becomes what was stored.
// It reports false when resp is to be buffered after all (its headers
// alone are over max_response_body).
func (o *owner) startStream(resp *http.Response) bool {
	x := o.x
	s := &x.rt.settings
	head := settledRecord(o.held.rec, o.held.rec.Token, claim.Streamed, resp.StatusCode, storedHeader(x.rt, resp.Header), time.Time{})
	if headerSize(head.Header) > s.MaxResponseBody {
		return false
	}
	if s.AdvertiseRetention {
		resp.Header.Set(retentionHeader, retentionSeconds(s.Retention))
	}
	var at int
	err := x.a.retried("stream_start", func(ctx context.Context) (err error) {
		at, err = x.p.store.StreamStart(ctx, x.a.hashedKey, head, s.Retention, s.Lease)
		return err
	})
	if err != nil {
		// As for a buffered answer that cannot be stored: the upstream
		// acted, its client gets the answer (unrecorded), and the window
		// is counted.
		o.held.settle(func() *reply {
			if errors.Is(err, claim.ErrLeaseLost) {
				return settled(outcomeFenceLost, "the lease lapsed and another attempt holds the key; the stream was relayed unrecorded")
			}
			return settled(outcomeStoreError, "upstream answered a stream whose head could not be stored (dual-write window), relayed unrecorded: "+err.Error())
		})
		o.noteSettled()
		return true
	}
	o.held.settle(func() *reply { return settled(outcomeStored, detailStreamed) })
	o.noteSettled()
	p := &streamPump{o: o, body: resp.Body, at: at, start: x.start, lastWrite: time.Now(),
		done: make(chan struct{}), rc: http.NewResponseController(x.w), chunks: x.h.metrics.streamChunks.WithLabelValues(x.rt.name)}
	p.cond = sync.NewCond(&p.mu)
	if s.StreamFlushInterval > 0 {
		p.coalesce = newCoalescer(resp.Body, s.StreamFlushInterval, streamReadBuf, streamPending, p.hold, p.release)
	} else {
		p.buf = readBufs.Get().(*[streamReadBuf]byte)
		p.hold(streamReadBuf)
	}
	o.stream = p
	resp.Body = p
	p.storeMu.Lock()
	p.renew = time.AfterFunc(s.Lease/3, p.renewDue)
	p.storeMu.Unlock()
	p.mu.Lock()
	p.left, p.armed, p.look = time.Now(), true, streamTakeover
	p.takeover = time.AfterFunc(streamTakeover, p.background) // until the client first reads
	p.mu.Unlock()
	return true
}

// streamReadBuf is the pump's read buffer, kept in readBufs between
// streams.
const streamReadBuf = 32 << 10

var readBufs = sync.Pool{New: func() any { return new([streamReadBuf]byte) }}

// hold counts n more bytes the pump holds in the buffer budget; release
// gives n back.
func (p *streamPump) hold(n int) {
	if n > 0 {
		p.o.x.p.buffers.force(p.o.x.bufs.holder, n)
	}
}

func (p *streamPump) release(n int) {
	if n > 0 {
		p.o.x.p.buffers.give(p.o.x.bufs.holder, n)
	}
}

// pump reads the upstream once, stores what it read and hands it to the
// owner's client; at the upstream's end, or when a chunk cannot be
// stored, it records how the stream ended. The caller set p.pumping.
func (p *streamPump) pump() {
	var chunk []byte
	var err error
	if p.coalesce != nil {
		chunk, err = p.coalesce.next() // counted in the budget already
	} else {
		var n int
		n, err = p.body.Read(p.buf[:])
		chunk = slices.Clone(p.buf[:n]) // the store may hold it past a timed-out send
		p.hold(n)
	}
	p.storeMu.Lock()
	defer p.storeMu.Unlock()
	if p.ended { // once the stream ended, what is read is dropped
		p.release(len(chunk))
		return
	}
	if len(chunk) > 0 && !p.append(chunk) {
		p.release(len(chunk)) // never sent
		p.end(claim.StreamAborted, errStreamAborted)
		return
	}
	switch {
	case err == io.EOF:
		p.end(claim.StreamEnded, io.EOF)
	case err != nil:
		p.unknown = "the stream broke off: " + err.Error()
		p.end(claim.StreamAborted, errStreamAborted)
	}
}

// pumpTurn pumps once as the one pumping goroutine (p.mu held, released
// meanwhile); then the next may pump, and once the stream ended nobody
// will.
func (p *streamPump) pumpTurn() {
	p.pumping = true
	p.mu.Unlock()
	p.pump()
	p.mu.Lock()
	p.pumping = false
	p.cond.Broadcast()
	p.finishLocked()
}

// background pumps while the owner's client is away from Read (writing,
// stalled, or gone), and hands back to it once it waits in Read again.
func (p *streamPump) background() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	if p.reading {
		p.look = min(2*p.look, streamLookMax)
		p.armTakeover(p.look)
		return
	}
	p.look = streamTakeover
	if wait := streamTakeover - time.Since(p.left); wait > 0 && !p.gone {
		p.armTakeover(wait)
		return
	}
	for !p.outDone && !p.pumping && !p.reading {
		p.pumpTurn()
	}
}

// renewDue renews the owner's lease when nothing was stored for a third
// of it; a renewal that fails ends the stream, unblocking the pumping
// goroutine's read.
func (p *streamPump) renewDue() {
	p.storeMu.Lock()
	defer p.storeMu.Unlock()
	if p.ended {
		return
	}
	third := p.o.x.rt.settings.Lease / 3
	if wait := time.Until(p.lastWrite.Add(third)); wait > 0 {
		p.renew.Reset(wait)
		return
	}
	if !p.append(nil) {
		p.end(claim.StreamAborted, errStreamAborted)
		return
	}
	p.renew.Reset(third)
}

// append stores chunk (empty: renews the lease) and hands it to the
// owner's client; false when it could not be stored (p.storeMu held).
// Past max_response_body nothing more is stored and the record says so:
// the first client's stream goes on.
func (p *streamPump) append(chunk []byte) bool {
	x := p.o.x
	s := &x.rt.settings
	if !p.tooBig && p.stored+int64(len(chunk)) > s.MaxResponseBody {
		p.tooBig = true
		_ = x.a.detached("stream_end", func(ctx context.Context) error {
			return x.p.store.StreamFinish(ctx, x.a.hashedKey, p.o.held.rec.Token, claim.StreamTooLarge, -1)
		})
		p.detail = "streamed past max_response_body: the record is not replayable, the first client's stream went on"
	}
	if p.tooBig {
		p.hand(chunk, -1, -1) // not stored: the client must take it from here
		return true
	}
	from := p.at
	err := x.a.retriedOn(p.callCtx, "stream_append", func(ctx context.Context) error {
		n, err := x.p.store.StreamAppend(ctx, x.a.hashedKey, p.o.held.rec.Token, p.at, chunk, s.Lease)
		if err == nil {
			p.at = n
		}
		return err
	})
	if err != nil {
		x.log().Warn("stream chunk not stored: the stream ends here for every reader", "route", x.rt.name, "key", x.a.hashedKey, "request_id", x.requestID, "err", err)
		p.detail = "a chunk could not be stored, so it was never sent: the stream ended abnormally: " + err.Error()
		return false
	}
	p.lastWrite = time.Now()
	if len(chunk) > 0 {
		p.stored += int64(len(chunk))
		p.chunks.Inc()
		if !p.first {
			p.first = true
			x.h.metrics.streamFirstByte.WithLabelValues(x.rt.name).Observe(time.Since(p.start).Seconds())
		}
	}
	p.hand(chunk, from, p.at)
	return true
}

// hand gives chunk, stored from the value's byte from to to, to the
// owner's client. A client more than streamPending behind is never waited
// for: it reads from the store from there on (Read). A chunk that was not
// stored (from < 0: past max_response_body) cannot be read back, so for
// it the pump waits for the client instead.
func (p *streamPump) hand(chunk []byte, from, to int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if to >= 0 {
		p.storedTo = to
	}
	for from < 0 && len(p.out) >= streamPending && !p.gone {
		p.cond.Wait()
	}
	switch {
	case len(chunk) == 0:
	case p.gone:
		p.release(len(chunk)) // nobody takes it
	case p.lagging && from == p.lagFrom && len(p.out) == 0:
		p.lagging = false // it read back all there was: caught up
		p.take(chunk)
	case from >= 0 && (p.lagging || len(p.out)+len(chunk) > streamPending):
		if !p.lagging {
			p.lagging, p.lagFrom = true, from
			if !p.lagged { // a client, counted once however often it falls behind
				p.lagged = true
				p.o.x.h.metrics.streamLagging.WithLabelValues(p.o.x.rt.name).Inc()
			}
		}
		p.release(len(chunk)) // the client reads it from the store
	default:
		p.take(chunk)
	}
	p.cond.Broadcast()
}

// take adds chunk, which the pump read (or coalesced) for itself, to out
// (p.mu held): as out itself when out is empty, so that the owner's
// client's part is not copied once more on its way.
func (p *streamPump) take(chunk []byte) {
	if len(p.out) == 0 {
		p.out = chunk
		return
	}
	p.out = append(p.out, chunk...)
}

// callCtx is the context of the pump's next store call (p.storeMu held):
// bounded as settleCtx is, but one for many calls, each of which has
// between half of settleTimeout and all of it. A context and its timer
// per event woke the runtime's timers for every event.
func (p *streamPump) callCtx() (context.Context, context.CancelFunc) {
	if p.call == nil || time.Until(p.callEnds) < settleTimeout/2 {
		if p.callCancel != nil {
			p.callCancel() // no call runs on it: they are serialized by storeMu
		}
		p.callEnds = time.Now().Add(settleTimeout)
		p.call, p.callCancel = context.WithDeadline(context.Background(), p.callEnds)
	}
	return p.call, func() {}
}

// end records how the stream ended (a normal end only once every chunk
// is stored, fenced on the stored length) and ends the owner's client's
// stream the same way: a normal end that cannot be recorded is an
// abnormal one for every reader (p.storeMu held). Closing the upstream's
// body unblocks a goroutine still reading it.
func (p *streamPump) end(how claim.StreamEnd, clientErr error) {
	x := p.o.x
	p.ended = true
	p.renew.Stop()
	if p.callCancel != nil {
		defer p.callCancel()
	}
	if !p.tooBig {
		at := -1
		if how == claim.StreamEnded {
			at = p.at
		}
		err := x.a.retried("stream_end", func(ctx context.Context) error {
			return x.p.store.StreamFinish(ctx, x.a.hashedKey, p.o.held.rec.Token, how, at)
		})
		if err != nil && how == claim.StreamEnded {
			clientErr = errStreamAborted
			p.detail = "the stream's end could not be recorded; it ends abnormally for every reader: " + err.Error()
		}
		x.h.metrics.storedBytes.Observe(float64(p.stored))
	}
	if clientErr != io.EOF {
		// The request line says why (it said "streamed" since the head was
		// stored), and so does one warning, joinable with it.
		if p.detail == "" {
			p.detail = "the stream ended abnormally"
			if p.unknown != "" {
				p.detail = p.unknown
			}
		}
		x.log().Warn("stream broke off: every reader gets the stored prefix and an abnormal end; nothing executes again",
			"route", x.rt.name, "key", x.a.hashedKey, "request_id", x.requestID, "cause", p.detail, "stored_bytes", p.stored)
	}
	end := "ended"
	p.how = claim.StreamEnded
	switch {
	case p.tooBig:
		end, p.how = "too_large", claim.StreamTooLarge
	case clientErr != io.EOF:
		end, p.how = "aborted", claim.StreamAborted
	}
	x.h.metrics.streamEnds.WithLabelValues(x.rt.name, end).Inc()
	_ = p.body.Close()
	if p.coalesce != nil {
		p.coalesce.stop()
	}
	p.mu.Lock()
	p.outDone, p.outErr = true, clientErr
	p.takeover.Stop()
	p.cond.Broadcast()
	p.finishLocked()
	p.mu.Unlock()
}

// finishLocked closes done once the stream ended and nobody pumps any
// more (p.mu held): past it nothing of the pump touches the exchange.
func (p *streamPump) finishLocked() {
	if !p.outDone || p.pumping || p.closed {
		return
	}
	p.closed = true
	if p.buf != nil {
		p.release(streamReadBuf)
		readBufs.Put(p.buf) // nobody pumps any more
		p.buf = nil
	}
	close(p.done)
}

// Read is the owner's client's body: what was stored, as it is; once that
// client lags, read back from the store. When nothing waits for it and
// nobody pumps, it pumps itself.
func (p *streamPump) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reading = true
	defer func() { p.reading = false }()
	for {
		switch {
		case len(p.out) > 0:
			n := copy(b, p.out)
			p.release(n)
			p.out = p.out[n:]
			if len(p.out) == 0 {
				p.out = nil
			}
			p.cond.Broadcast()
			// The client must take this within client.write_timeout, or it
			// is cut (the stream goes on, stored, for the retries).
			now := time.Now()
			_ = p.rc.SetWriteDeadline(now.Add(time.Duration(p.o.x.h.writeTimeout.Load())))
			p.left = now
			p.armTakeover(streamTakeover)
			return n, nil
		case p.lagging && p.lagFrom < p.storedTo:
			if err := p.readBack(); err != nil {
				return 0, err
			}
		case p.outDone:
			_ = p.rc.SetWriteDeadline(time.Time{}) // the connection may serve another request
			return 0, p.outErr
		case !p.pumping:
			p.pumpTurn()
		default:
			p.cond.Wait()
		}
	}
}

// readBack reads, for a lagging owner's client, the stored stream from
// lagFrom into out (p.mu held, released while the store answers). A read
// that fails ends that client's stream abnormally; the stream goes on,
// stored, for the retries.
func (p *streamPump) readBack() error {
	x := p.o.x
	from := p.lagFrom
	p.mu.Unlock()
	var part claim.StreamPart
	err := x.a.storeOp(x.r.Context(), "stream_read", func(ctx context.Context) (err error) {
		part, err = x.p.store.StreamRead(ctx, x.a.hashedKey, from, streamReadMax)
		return err
	})
	p.mu.Lock()
	if err != nil {
		x.log().Warn("a lagging stream client cut: the stream could not be read back", "route", x.rt.name, "key", x.a.hashedKey, "request_id", x.requestID, "err", err)
		return errStreamAborted
	}
	p.lagFrom = part.Next
	if !p.gone && len(part.Data) > 0 {
		p.hold(len(part.Data))
		p.out = append(p.out, part.Data...)
	}
	return nil
}

// Close is the owner's client going away (or done): the stream goes on,
// stored, for the retries, pumped in the background.
func (p *streamPump) Close() error {
	p.mu.Lock()
	p.release(len(p.out))
	p.gone, p.out = true, nil
	p.cond.Broadcast()
	if !p.outDone {
		p.armed = true
		p.takeover.Reset(0)
	}
	p.mu.Unlock()
	return nil
}

// armTakeover sets the takeover timer to d from now, unless it is set
// already or the stream ended (p.mu held).
func (p *streamPump) armTakeover(d time.Duration) {
	if !p.armed && !p.outDone {
		p.armed = true
		p.takeover.Reset(d)
	}
}

// pumpEnd is how a stream ended, as wait returns it.
type pumpEnd struct {
	// how is how it ended for every reader: StreamEnded, StreamAborted,
	// or StreamTooLarge (its first client got it whole, the record says
	// it is not replayable).
	how claim.StreamEnd
	// detail, when set, is what the request's line says of it; unknown
	// why the call's outcome is unknown, when it broke off.
	detail, unknown string
}

// wait returns once the stream ended and was recorded, and how it ended.
func (p *streamPump) wait() pumpEnd {
	<-p.done
	return pumpEnd{how: p.how, detail: p.detail, unknown: p.unknown}
}
