package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// protocol is what every attempt on a key shares, whatever front it came
// through: the store and its codec, the clocks, what this sidecar saw of
// other owners' claims, the protocol's metrics and logger, and the bounds
// on what principals hold. Handler, the HTTP front, holds one and builds
// its exchanges' attempts on it; a front without an HTTP request (a test
// drives one; the key API's reconcile-now is one) builds attempts on it
// directly. It knows no HTTP request.
type protocol struct {
	store Store
	// codec is the store's: key derivation and fingerprint comparison.
	codec   *claim.Codec
	log     *slog.Logger
	metrics *Metrics
	// rand is the source of owner tokens and request ids.
	rand io.Reader
	// now is this process' wall clock (Options.Clock), for the times
	// other processes read or wrote; deadlines run on time.Now's
	// monotonic clock.
	now func() time.Time
	// safetyPoll is the longest a waiting retry goes without looking at
	// its key.
	safetyPoll time.Duration
	// upstreamTimeout is upstream.timeout, what a client waits;
	// lateWindow is upstream.late_answer_window, how much longer an
	// owner's call may run for its late answer.
	upstreamTimeout, lateWindow time.Duration
	// streams is Config.Streams: answers may be stored as streams.
	streams bool

	// liveness is what this sidecar saw of claims in progress, to judge
	// their owners gone on its own clock; orphans when it first saw each
	// key whose outcome is unknown on a reconcile route (liveness.go).
	liveness *liveness
	orphans  *orphans
	// unconfirmed cleans up claims whose reply never came.
	unconfirmed unconfirmed
	// buffers bounds the bytes held in body buffers
	// (limits.max_buffered_bytes); forwarding counts first attempts
	// forwarding now, per route (max_in_flight); late holds the slots of
	// the owners' calls running past upstream.timeout now.
	buffers    budget
	forwarding inFlight
	late       lateCalls
	// owners are the claims this process owns and has not settled;
	// abandoned is set by Abandon: calls starting after it are cancelled
	// at once.
	owners    claimAges
	abandoned atomic.Bool
	// waiting counts retries waiting for a first attempt (concurrent: wait).
	waiting atomic.Int64
	// streamReaders counts the retries following each stream here
	// (stream.go); streamReads shares the store reads of a running stream
	// among its followers on this sidecar (fanout.go).
	streamReaders attached
	streamReads   sharedReads
	// keyChanges bound how long webhook routes read the keys of earlier
	// releases (useLegacyKey).
	keyChanges [keyChanges]keyChange
	// lookup asks the upstream what became of a key (a reconcile route's
	// lookup): the front's way to reach the upstream.
	lookup func(ctx context.Context, rt *route, principal, key string, max int64) lookupAnswer
}

// storeError counts a failure of store operation op in
// idemproxy_store_errors_total: the one place it is counted.
func (p *protocol) storeError(op string) { p.metrics.storeErrors.WithLabelValues(op).Inc() }

// Store is what the proxy needs of a backend (claim.Store): the
// protocol's operations on a key, its Codec, and its spans' names.
type Store = claim.Store

// codecOf is store's Codec (nil without a store: a Handler built only to
// check a configuration).
func codecOf(store Store) *claim.Codec {
	if store == nil {
		return nil
	}
	return store.Codec()
}

// lookupAnswer is what one lookup learned: result, and for a found answer
// the response to store (status, headers, body); why says what went wrong
// for an unresolved one.
type lookupAnswer struct {
	result string
	// status is what a found answer is stored with; upstreamStatus what
	// the lookup answered (zero: no answer).
	status, upstreamStatus int
	header                 http.Header
	body                   []byte
	why                    string
}

// keyChange is when the store first served a change of webhook keys,
// read once per process: until one retention after it, the keys the
// change replaced are looked at too.
type keyChange struct {
	since atomic.Int64 // Unix nanoseconds; 0 until read
	mu    sync.Mutex   // one read at a time
}
