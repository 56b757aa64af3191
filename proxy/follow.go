package proxy

// Following a streamed answer: a retry attached to a stream (attach, the
// reply) writes what is stored, then each new chunk as it is stored, until
// the stream ends (follow, followLive), on any sidecar.

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

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
	if rec.StreamEnd == claim.StreamRunning && !a.p.streamReaders.take(a.hashedKey, a.principal) {
		return a.inProgress("this stream, or this principal, has as many retries following streams as this sidecar allows; retry after the time in Retry-After", time.Second)
	}
	return &reply{outcome: outcomeReplayed, record: rec, replayed: true, stream: true}
}

// streamTooLong answers a retry of a streamed record longer than the
// route stores: record-unreadable, counted as too_large.
func (a *attempt) streamTooLong() *reply {
	a.p.metrics.recordErrors.WithLabelValues(claim.ReasonTooLarge).Inc()
	return refuse(outcomeRecordUnreadable, probRecordCorrupt.with("the stream stored for this key is longer than this route's max_response_body, which idemproxy never stores; nothing was forwarded"))
}

// follow writes a streamed record's answer: what is stored, then, while
// the stream runs, each new chunk as it is stored, until it ends. It
// returns what it wrote, and aborted when the stream ended abnormally:
// the caller ends the answer the protocol's own way (the handler aborts,
// so that the chunked body is closed without its last chunk).
func (x *exchange) follow(rec *claim.Record) (res result, aborted bool) {
	if rec.StreamEnd == claim.StreamRunning {
		defer x.p.streamReaders.give(x.a.hashedKey, x.a.principal)
	}
	stored := int64(len(rec.Body))
	if at, id, ok := resumeFrom(x.r, rec, rec.Body); ok {
		// The client had every event up to id: the rest, and what follows.
		resumed := *rec
		resumed.Body = rec.Body[at:]
		x.w.Header().Set(resumedHeader, id)
		rec = &resumed
	}
	res = x.writeRecord(rec, true)
	rc := http.NewResponseController(x.w)
	_ = rc.Flush()
	end := rec.StreamEnd
	if end == claim.StreamRunning {
		end = x.followLive(rc, rec.StreamLen, stored, x.a.followDeadline(rec))
	}
	switch end {
	case claim.StreamEnded:
		return res, false
	case streamClientGone:
		res.detail = "the client went away while following the stream"
	default:
		res.detail = "replayed a stream that ended abnormally (" + end.String() + "): same prefix, same abnormal end"
	}
	return res, true
}

// readStream reads key's stream from at for a follower, sharing the read
// with every follower of it on this sidecar asking the same (fanout.go).
func (a *attempt) readStream(ctx context.Context, at int) (claim.StreamPart, error) {
	return a.p.streamReads.read(ctx, a.hashedKey, at, func(ctx context.Context) (part claim.StreamPart, err error) {
		err = a.storeOp(ctx, "stream_read", func(ctx context.Context) (err error) {
			part, err = a.p.store.StreamRead(ctx, a.hashedKey, at, streamReadMax)
			return err
		})
		return part, err
	})
}

// followerTooLong cuts a follower of a stream grown past what its owner
// ever stores (planted or edited), counted as too_large.
func (a *attempt) followerTooLong() claim.StreamEnd {
	a.p.metrics.recordErrors.WithLabelValues(claim.ReasonTooLarge).Inc()
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
	budget := a.p.upstreamTimeout + a.p.lateWindow
	deadline := a.start.Add(budget)
	if !rec.Created.IsZero() {
		// The owner's start is on its wall clock: what is left of its
		// budget by this one's, counted from now on the monotonic clock.
		if owners := time.Now().Add(rec.Created.Add(budget).Sub(a.p.now())); owners.Before(deadline) {
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
	watch := x.p.store.Watch(ctx, x.a.hashedKey)
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
			x.log().Warn("stream follower cut: the stream ran past upstream.timeout + late_answer_window", "route", x.rt.name, "key", x.a.hashedKey, "request_id", x.requestID)
			return claim.StreamAborted
		case <-watch.C():
			x.h.metrics.wakeupNotify.Inc()
		case <-timer.C:
			if looked {
				x.h.metrics.wakeupPoll.Inc()
			}
		}
		looked = true
		part, err := x.a.readStream(ctx, at)
		if err != nil {
			if ctx.Err() != nil {
				return streamClientGone
			}
			if failures++; failures > len(storeRetryWaits) || !errors.Is(err, claim.ErrUnavailable) {
				x.log().Warn("stream follower cut: the stream could not be read", "route", x.rt.name, "key", x.a.hashedKey, "request_id", x.requestID, "err", err)
				return claim.StreamAborted
			}
			timer.Reset(100 * time.Millisecond)
			continue
		}
		failures = 0
		if !counted && (part.End == claim.StreamRunning || at < part.Len) {
			// Attached: the stream still ran (or grew) when first read.
			counted = true
			x.h.metrics.streamAttached.WithLabelValues(x.rt.name).Inc()
		}
		if stored += int64(len(part.Data)); stored > x.rt.settings.MaxResponseBody {
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
