package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// reply is the answer a step of the exchange decided: a problem idemproxy
// writes itself, a stored record, or a forward without protection. Steps
// return one (nil: nothing decided, go on) and respond alone writes it;
// the one other answer is the upstream's own, which the owner forwards
// through its gate (owner.go).
type reply struct {
	// outcome is what finish counts and logs once the handler returns
	// (outcomeRejected: not acceptable, nothing forwarded or stored);
	// every reply has one, an owner's the one its settlement decided
	// (settledAs).
	outcome string
	// detail, when set, is the log line's detail in place of the
	// problem's.
	detail string
	// problem is the answer when record is nil and bypass is not set:
	// problem+json in the route's problem_body.
	problem problem
	// record, when set, is a completed record whose response is written;
	// replayed marks it a replay, of the attempt that stored it.
	record   *claim.Record
	replayed bool
	// stream: record is a streamed one, followed while it runs
	// (stream.go).
	stream bool
	// bypass forwards the request without protection; body, when not
	// nil, is the request body already read.
	bypass bool
	body   []byte
	// gone: the client went away; nothing is written.
	gone bool
	// unknown, when set, says why the outcome of the call the reply
	// settles is unknown (holding.fail).
	unknown string
}

// refuse is the reply that answers problem p, counted as outcome.
func refuse(outcome string, p problem) *reply {
	return &reply{outcome: outcome, problem: p}
}

// withDetail sets what the log line says of the reply.
func (r *reply) withDetail(detail string) *reply {
	r.detail = detail
	return r
}

// replayOf is the reply that writes rec's stored response as a replay,
// counted as outcome (outcomeReplayed, or outcomeReconciled).
func replayOf(rec *claim.Record, outcome string) *reply {
	return &reply{outcome: outcome, record: rec, replayed: true}
}

// bypassWith is the reply that forwards the request unprotected.
func bypassWith(body []byte, why string) *reply {
	return &reply{outcome: outcomeBypassed, detail: why, bypass: true, body: body}
}

// notReplayable answers a retry of a key whose first attempt was executed
// with an answer too large to store (or to replay) on this route.
func notReplayable(rec *claim.Record) *reply {
	p := probNotReplayable.with(fmt.Sprintf("the first attempt was executed and answered %d, with a body larger than this route's max_response_body", rec.Status))
	p.OriginalStatus = rec.Status
	return refuse(outcomeConflict, p)
}

// bufferRefused answers a request refused room in the buffer budget (err
// is errOverBudget or errOverShare): 503 buffers-full or 429
// too-many-bytes, retry after a second; kept says what was left as it was.
func bufferRefused(err error, kept string) *reply {
	p := probBuffersFull.with("idemproxy holds as many bytes as limits.max_buffered_bytes allows; " + kept + ", retry later")
	if errors.Is(err, errOverShare) {
		p = probTooManyBytes.with("this principal's requests in flight hold their whole share of limits.max_buffered_bytes; " + kept + ", retry later")
	}
	p.retryAfter = time.Second
	return refuse(outcomeRejected, p)
}
