package proxy

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Streamed answers (routes[].stream: auto, store.record_format 4): an
// answer without Content-Length whose Content-Type is text/event-stream
// or application/x-ndjson is relayed as it arrives instead of buffered.
// Its status and headers replace the owner's claim (claim.StreamStart),
// then every chunk is appended to the key's record before any client
// sees it: the owner's streamPump reads the upstream at the upstream's
// pace and stores what each read brought (pump); its own client follows
// what was stored, as an attached retry does on any sidecar (follow). A
// stream that breaks off (the upstream reset, the store failed, the owner's budget or
// a drain ran out) is recorded as aborted, and every reader ends it
// abnormally after the same prefix: a chunked body closed without its
// last chunk. Past max_response_body the first client's stream goes on
// and the record says it is not replayable. What the pump holds (read and
// not stored, stored and not yet taken by its client, its read buffer)
// counts in limits.max_buffered_bytes, against the principal, as a
// buffered answer does: the upstream has acted, so it is held whatever
// the limit, and new requests are refused room while it is.

// streamTypes are the media types relayed as they arrive.
var streamTypes = map[string]bool{"text/event-stream": true, "application/x-ndjson": true}

// isStream reports whether resp is an answer to relay as it arrives.
func isStream(resp *http.Response) bool {
	if resp.ContentLength != -1 {
		return false
	}
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return err == nil && streamTypes[mt]
}

const (
	// streamPending bounds what the pump holds read from the upstream
	// and not yet stored, and what its own client has not yet taken:
	// past it the upstream is read no faster than they go.
	streamPending = 1 << 20
	// streamReadMax is the most one follower's read takes from Redis.
	streamReadMax = 256 << 10
	// streamPoll is how often a follower looks when no message woke it.
	streamPoll = 250 * time.Millisecond
	// maxAttached bounds the retries following one stream on this
	// sidecar, and those one principal has following its streams; past
	// it they get the route's in_progress_status.
	maxAttached = 64
)

// errStreamAborted ends a stream abnormally for its own client.
var errStreamAborted = errors.New("the stream broke off; what was stored is kept and replayed with the same abnormal end")

// detailStreamed is a streamed answer's request-line detail while it
// runs, and once it ended normally.
const detailStreamed = "streamed"

// streamPump relays one streamed answer for its owner. One goroutine at a
// time pumps (reads the upstream, stores what it read, hands it on): the
// owner's client's own, inside Read, while it keeps up, so an event costs
// that goroutine one read, one append and one write, as ReverseProxy's
// copy does plus the store's round trip; a goroutine of the pump's own
// (background) once that client has not come back to Read for
// streamTakeover, or went away. Renewals run on a timer of their own
// (renewDue), serialized with the appends, which nothing a client does
// can hold back.
type streamPump struct {
	o     *owner
	body  io.ReadCloser // the upstream's
	start time.Time
	buf   []byte // the read buffer, the pumping goroutine's (no coalescer)
	// coalesce, on a route with a stream_flush_interval, reads the
	// upstream and gives the pump at most one part per interval.
	coalesce *coalescer

	// storeMu serializes what is written to the store: appends, renewals
	// and the end, and the fields below.
	storeMu   sync.Mutex
	at        int // the stored value's length
	lastWrite time.Time
	ended     bool
	stored    int64
	first     bool
	tooBig    bool
	renew     *time.Timer

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
	done              chan struct{}
	// rc is the owner's client's connection, whose write deadline each
	// part handed to it renews (client.write_timeout).
	rc *http.ResponseController
}

// streamTakeover is how long the owner's client may be away from Read
// (writing what it took) before the pump reads the upstream without it.
const streamTakeover = 10 * time.Millisecond

// startStream begins relaying resp, a stream, as its owner: the head is
// stored in place of the claim, and resp's body becomes what was stored.
// It reports false when resp is to be buffered after all (its headers
// alone are over max_response_body).
func (o *owner) startStream(resp *http.Response) bool {
	x := o.x
	s := &x.a.rt.settings
	head := settledRecord(o.rec, o.rec.Token, claim.Streamed, resp.StatusCode, storedHeader(x.a.rt, resp.Header), time.Time{})
	if headerSize(head.Header) > s.MaxResponseBody {
		return false
	}
	if s.AdvertiseRetention {
		resp.Header.Set(retentionHeader, retentionSeconds(s.Retention))
	}
	var at int
	err := x.a.retried("stream_start", func(ctx context.Context) (err error) {
		at, err = x.a.h.store.StreamStart(ctx, x.a.hashedKey, head, s.Retention, s.Lease)
		return err
	})
	if err != nil {
		// As for a buffered answer that cannot be stored: the upstream
		// acted, its client gets the answer (unrecorded), and the window
		// is counted.
		o.settle(func() *reply {
			if errors.Is(err, claim.ErrLeaseLost) {
				return settled(outcomeFenceLost, "the lease lapsed and another attempt holds the key; the stream was relayed unrecorded")
			}
			return settled(outcomeStoreError, "upstream answered a stream whose head could not be stored (dual-write window), relayed unrecorded: "+err.Error())
		})
		return true
	}
	o.settle(func() *reply { return settled(outcomeStored, detailStreamed) })
	p := &streamPump{o: o, body: resp.Body, at: at, start: x.a.start, lastWrite: time.Now(),
		done: make(chan struct{}), rc: http.NewResponseController(x.w)}
	p.cond = sync.NewCond(&p.mu)
	if s.StreamFlushInterval > 0 {
		p.coalesce = newCoalescer(resp.Body, s.StreamFlushInterval, streamReadBuf, streamPending, p.hold, p.release)
	} else {
		p.buf = make([]byte, streamReadBuf)
		p.hold(streamReadBuf)
	}
	o.stream = p
	resp.Body = p
	p.storeMu.Lock()
	p.renew = time.AfterFunc(s.Lease/3, p.renewDue)
	p.storeMu.Unlock()
	p.mu.Lock()
	p.takeover = time.AfterFunc(streamTakeover, p.background) // until the client first reads
	p.mu.Unlock()
	return true
}

// streamReadBuf is the pump's read buffer.
const streamReadBuf = 32 << 10

// hold counts n more bytes the pump holds in the buffer budget; release
// gives n back.
func (p *streamPump) hold(n int) {
	if n > 0 {
		p.o.x.a.h.buffers.force(p.o.x.a.principal, n)
	}
}

func (p *streamPump) release(n int) {
	if n > 0 {
		p.o.x.a.h.buffers.give(p.o.x.a.principal, n)
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
		n, err = p.body.Read(p.buf)
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
		p.o.x.unknown = "the stream broke off: " + err.Error()
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
	third := p.o.x.a.rt.settings.Lease / 3
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
	s := &x.a.rt.settings
	if !p.tooBig && p.stored+int64(len(chunk)) > s.MaxResponseBody {
		p.tooBig = true
		_ = x.a.detached("stream_end", func(ctx context.Context) error {
			return x.a.h.store.StreamFinish(ctx, x.a.hashedKey, p.o.rec.Token, claim.StreamTooLarge, -1)
		})
		x.detail = "streamed past max_response_body: the record is not replayable, the first client's stream went on"
	}
	if p.tooBig {
		p.hand(chunk, -1, -1) // not stored: the client must take it from here
		return true
	}
	from := p.at
	err := x.a.retried("stream_append", func(ctx context.Context) error {
		n, err := x.a.h.store.StreamAppend(ctx, x.a.hashedKey, p.o.rec.Token, p.at, chunk, s.Lease)
		if err == nil {
			p.at = n
		}
		return err
	})
	if err != nil {
		x.a.log().Warn("stream chunk not stored: the stream ends here for every reader", "route", x.a.rt.name, "key", x.a.hashedKey, "request_id", x.a.requestID, "err", err)
		x.detail = "a chunk could not be stored, so it was never sent: the stream ended abnormally: " + err.Error()
		return false
	}
	p.lastWrite = time.Now()
	if len(chunk) > 0 {
		p.stored += int64(len(chunk))
		x.a.h.metrics.streamChunks.WithLabelValues(x.a.rt.name).Inc()
		if !p.first {
			p.first = true
			x.a.h.metrics.streamFirstByte.WithLabelValues(x.a.rt.name).Observe(time.Since(p.start).Seconds())
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
		p.out = append(p.out, chunk...)
	case from >= 0 && (p.lagging || len(p.out)+len(chunk) > streamPending):
		if !p.lagging {
			p.lagging, p.lagFrom = true, from
			if !p.lagged { // a client, counted once however often it falls behind
				p.lagged = true
				p.o.x.a.h.metrics.streamLagging.WithLabelValues(p.o.x.a.rt.name).Inc()
			}
		}
		p.release(len(chunk)) // the client reads it from the store
	default:
		p.out = append(p.out, chunk...)
	}
	p.cond.Broadcast()
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
	if !p.tooBig {
		at := -1
		if how == claim.StreamEnded {
			at = p.at
		}
		err := x.a.retried("stream_end", func(ctx context.Context) error {
			return x.a.h.store.StreamFinish(ctx, x.a.hashedKey, p.o.rec.Token, how, at)
		})
		if err != nil && how == claim.StreamEnded {
			clientErr = errStreamAborted
			x.detail = "the stream's end could not be recorded; it ends abnormally for every reader: " + err.Error()
		}
		x.a.h.metrics.storedBytes.Observe(float64(p.stored))
	}
	if clientErr != io.EOF {
		// The request line says why (it said "streamed" since the head was
		// stored), and so does one warning, joinable with it.
		if x.detail == "" || x.detail == detailStreamed {
			x.detail = "the stream ended abnormally"
			if x.unknown != "" {
				x.detail = x.unknown
			}
		}
		x.a.log().Warn("stream broke off: every reader gets the stored prefix and an abnormal end; nothing executes again",
			"route", x.a.rt.name, "key", x.a.hashedKey, "request_id", x.a.requestID, "cause", x.detail, "stored_bytes", p.stored)
	}
	end := "ended"
	switch {
	case p.tooBig:
		end = "too_large"
	case clientErr != io.EOF:
		end = "aborted"
	}
	x.a.h.metrics.streamEnds.WithLabelValues(x.a.rt.name, end).Inc()
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
	}
	close(p.done)
}

// Read is the owner's client's body: what was stored, as it is; once that
// client lags, read back from the store. When nothing waits for it and
// nobody pumps, it pumps itself.
func (p *streamPump) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.takeover.Stop()
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
			_ = p.rc.SetWriteDeadline(time.Now().Add(time.Duration(p.o.x.a.h.writeTimeout.Load())))
			if !p.outDone {
				p.takeover.Reset(streamTakeover)
			}
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
		part, err = x.a.h.store.StreamRead(ctx, x.a.hashedKey, from, streamReadMax)
		return err
	})
	p.mu.Lock()
	if err != nil {
		x.a.log().Warn("a lagging stream client cut: the stream could not be read back", "route", x.a.rt.name, "key", x.a.hashedKey, "request_id", x.a.requestID, "err", err)
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
		p.takeover.Reset(0)
	}
	p.mu.Unlock()
	return nil
}

// wait returns once the stream ended and was recorded.
func (p *streamPump) wait() { <-p.done }

// attached counts the retries following each stream on this sidecar.
type attached struct {
	mu sync.Mutex
	// n counts followers by stream key, p by principal; mu guards both.
	n, p map[string]int
}

// take counts one more follower of key for principal, or reports false
// when the stream, or the principal across its streams, has maxAttached
// already on this sidecar.
func (a *attached) take(key, principal string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n, a.p = map[string]int{}, map[string]int{}
	}
	if a.n[key] >= maxAttached || a.p[principal] >= maxAttached {
		return false
	}
	a.n[key]++
	a.p[principal]++
	return true
}

func (a *attached) give(key, principal string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n[key]--; a.n[key] <= 0 {
		delete(a.n, key)
	}
	if a.p[principal]--; a.p[principal] <= 0 {
		delete(a.p, principal)
	}
}

// attach is the reply to a retry of a streamed answer: the stream as
// stored so far, then as it grows, marked as a replay; 409
// response-not-replayable past max_response_body.
func (a *attempt) attach(rec *claim.Record) *reply {
	if rec.StreamEnd == claim.StreamTooLarge {
		return notReplayable(rec)
	}
	if int64(len(rec.Body)) > a.rt.settings.MaxResponseBody {
		// The owner stores no more than max_response_body of a stream: a
		// longer one was planted or edited, and is not replayed.
		return a.streamTooLong()
	}
	if rec.StreamEnd == claim.StreamRunning && !a.h.streamReaders.take(a.hashedKey, a.principal) {
		return a.inProgress("this stream, or this principal, has as many retries following streams as this sidecar allows; retry after the time in Retry-After", time.Second)
	}
	return &reply{outcome: outcomeReplayed, record: rec, replayed: true, stream: true}
}

// streamTooLong answers a retry of a streamed record longer than the
// route stores: record-unreadable, counted as too_large.
func (a *attempt) streamTooLong() *reply {
	a.h.metrics.recordErrors.WithLabelValues(claim.ReasonTooLarge).Inc()
	return refuse(outcomeRecordUnreadable, probRecordCorrupt.with("the stream stored for this key is longer than this route's max_response_body, which idemproxy never stores; nothing was forwarded"))
}

// follow writes a streamed record's answer: what is stored, then, while
// the stream runs, each new chunk as it is stored, until it ends. An
// abnormal end is the protocol's own (the handler aborts, so that the
// chunked body is closed without its last chunk).
func (x *exchange) follow(rec *claim.Record) {
	if rec.StreamEnd == claim.StreamRunning {
		defer x.a.h.streamReaders.give(x.a.hashedKey, x.a.principal)
	}
	stored := int64(len(rec.Body))
	if at, id, ok := resumeFrom(x.r, rec, rec.Body); ok {
		// The client had every event up to id: the rest, and what follows.
		resumed := *rec
		resumed.Body = rec.Body[at:]
		x.w.Header().Set(resumedHeader, id)
		rec = &resumed
	}
	x.writeRecord(rec, true)
	rc := http.NewResponseController(x.w)
	_ = rc.Flush()
	end := rec.StreamEnd
	if end == claim.StreamRunning {
		end = x.followLive(rc, rec.StreamLen, stored, x.a.followDeadline(rec))
	}
	if end == claim.StreamEnded {
		return
	}
	x.detail = "replayed a stream that ended abnormally (" + end.String() + "): same prefix, same abnormal end"
	if end == streamClientGone {
		x.detail = "the client went away while following the stream"
	}
	panic(http.ErrAbortHandler)
}

// readStream reads key's stream from at for a follower, sharing the read
// with every follower of it on this sidecar asking the same (fanout.go).
func (a *attempt) readStream(ctx context.Context, at int) (claim.StreamPart, error) {
	return a.h.streamReads.read(ctx, a.hashedKey, at, func(ctx context.Context) (part claim.StreamPart, err error) {
		err = a.storeOp(ctx, "stream_read", func(ctx context.Context) (err error) {
			part, err = a.h.store.StreamRead(ctx, a.hashedKey, at, streamReadMax)
			return err
		})
		return part, err
	})
}

// followerTooLong cuts a follower of a stream grown past what its owner
// ever stores (planted or edited), counted as too_large.
func (a *attempt) followerTooLong() claim.StreamEnd {
	a.h.metrics.recordErrors.WithLabelValues(claim.ReasonTooLarge).Inc()
	a.log().Warn("stream follower cut: the stored stream grew past max_response_body", "route", a.rt.name, "key", a.hashedKey, "request_id", a.requestID)
	return claim.StreamAborted
}

// streamClientGone is followLive's end when the client went away.
const streamClientGone claim.StreamEnd = 255

// followDeadline is when a follower of rec, a running stream, is cut: no
// stream runs longer than upstream.timeout + late_answer_window after its
// first attempt began (its owner cancels the call then), nor, whatever a
// planted or damaged record says of its start or its lease, longer than
// that after this follower began.
func (a *attempt) followDeadline(rec *claim.Record) time.Time {
	budget := a.h.upstreamTimeout + a.h.lateWindow
	deadline := a.start.Add(budget)
	if !rec.Created.IsZero() {
		// The owner's start is on its wall clock: what is left of its
		// budget by this one's, counted from now on the monotonic clock.
		if owners := time.Now().Add(rec.Created.Add(budget).Sub(a.h.now())); owners.Before(deadline) {
			deadline = owners
		}
	}
	return deadline
}

// followLive writes a running stream's new chunks from at (the stored
// value's offset, after stored bytes of the stream) as they are stored,
// until it ends, or deadline passes or the stream grows past what its
// owner ever stores (the stream is then cut for this follower:
// claim.StreamAborted); it returns how.
func (x *exchange) followLive(rc *http.ResponseController, at int, stored int64, deadline time.Time) claim.StreamEnd {
	ctx := x.r.Context()
	watch := x.a.h.store.Watch(ctx, x.a.hashedKey)
	defer watch.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures, counted, looked := 0, false, false
	cut := time.NewTimer(time.Until(deadline))
	defer cut.Stop()
	for {
		select {
		case <-ctx.Done():
			return streamClientGone
		case <-cut.C:
			x.a.log().Warn("stream follower cut: the stream ran past upstream.timeout + late_answer_window", "route", x.a.rt.name, "key", x.a.hashedKey, "request_id", x.a.requestID)
			return claim.StreamAborted
		case <-watch.C():
			x.a.h.metrics.wakeupNotify.Inc()
		case <-timer.C:
			if looked {
				x.a.h.metrics.wakeupPoll.Inc()
			}
		}
		looked = true
		part, err := x.a.readStream(ctx, at)
		if err != nil {
			if ctx.Err() != nil {
				return streamClientGone
			}
			if failures++; failures > len(storeRetryWaits) || !errors.Is(err, claim.ErrUnavailable) {
				x.a.log().Warn("stream follower cut: the stream could not be read", "route", x.a.rt.name, "key", x.a.hashedKey, "request_id", x.a.requestID, "err", err)
				return claim.StreamAborted
			}
			timer.Reset(100 * time.Millisecond)
			continue
		}
		failures = 0
		if !counted && (part.End == claim.StreamRunning || at < part.Len) {
			// Attached: the stream still ran (or grew) when first read.
			counted = true
			x.a.h.metrics.streamAttached.WithLabelValues(x.a.rt.name).Inc()
		}
		if stored += int64(len(part.Data)); stored > x.a.rt.settings.MaxResponseBody {
			return x.a.followerTooLong()
		}
		if err := x.writeAnswer(rc, part.Data); err != nil {
			return streamClientGone
		}
		_ = rc.Flush()
		at = part.Next
		if at < part.Len {
			timer.Reset(0) // more to read now
			continue
		}
		if part.End != claim.StreamRunning {
			return part.End
		}
		timer.Reset(streamPoll)
	}
}
