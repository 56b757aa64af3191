package proxy

import (
	"errors"
	"mime"
	"net/http"
	"time"
)

// Streamed answers (routes[].stream: auto, store.record_format 4): an
// answer without Content-Length whose Content-Type is text/event-stream
// or application/x-ndjson is relayed as it arrives instead of buffered.
// Its status and headers replace the owner's claim (claim.StreamStart),
// then every chunk is appended to the key's record before any client
// sees it: the owner's streamPump reads the upstream at the upstream's
// pace and stores what each read brought (pump.go); its own client reads
// what was stored, as an attached retry does on any sidecar (follow.go). A
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
