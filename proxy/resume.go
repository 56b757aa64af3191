package proxy

import (
	"bytes"
	"mime"
	"net/http"

	"github.com/idemproxy/idemproxy/claim"
)

// Resuming a stream. An EventSource-style client whose stream broke off
// resends the id of the last event it got (Last-Event-ID); agent stacks
// expect a replay from that cursor. Nothing new is stored for it: the
// stored bytes of a server-sent-events stream carry the upstream's own
// id: fields, which are read as they are.

const (
	// lastEventIDHeader is the cursor an SSE client resends.
	lastEventIDHeader = "Last-Event-ID"
	// resumedHeader says after which event a replay resumed.
	resumedHeader = "Idempotent-Resumed-After"
)

// resumeFrom is where, in stream (the stored bytes of rec so far), a
// retry carrying Last-Event-ID resumes: just after the event whose id:
// field is that id, when rec is an SSE stream that holds it. ok is false
// (the whole stream is replayed) for another kind of stream, no
// Last-Event-ID, or an id the stream does not hold (yet).
func resumeFrom(r *http.Request, rec *claim.Record, stream []byte) (at int, id string, ok bool) {
	id = r.Header.Get(lastEventIDHeader)
	if id == "" || len(r.Header.Values(lastEventIDHeader)) != 1 {
		return 0, "", false
	}
	if mt, _, err := mime.ParseMediaType(rec.Header.Get("Content-Type")); err != nil || mt != "text/event-stream" {
		return 0, "", false
	}
	at, ok = afterEvent(stream, id)
	return at, id, ok
}

// afterEvent finds, in an SSE stream, the end of the first event whose
// id: field is id (the blank line that dispatches it included), per the
// HTML standard's parsing: lines end in CRLF, LF or CR; "id" with an
// optional space after its colon; an event is dispatched by a blank line.
func afterEvent(stream []byte, id string) (int, bool) {
	pos, matched := 0, false
	for pos < len(stream) {
		end := bytes.IndexAny(stream[pos:], "\r\n")
		if end < 0 {
			return 0, false // an incomplete last line: no event ends here
		}
		line := stream[pos : pos+end]
		next := pos + end + 1
		if stream[pos+end] == '\r' && next < len(stream) && stream[next] == '\n' {
			next++
		}
		if len(line) == 0 {
			if matched {
				return next, true
			}
			matched = false
		} else {
			if v, found := bytes.CutPrefix(line, []byte("id:")); found {
				v = bytes.TrimPrefix(v, []byte(" "))
				matched = string(v) == id
			} else if bytes.Equal(line, []byte("id")) {
				matched = id == ""
			}
		}
		pos = next
	}
	return 0, false
}
