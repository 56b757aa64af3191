package proxy

import (
	"net/http"
	"time"
)

// Writing answers to clients that may read nothing. A replay of a large
// answer, or a stream a retry follows, is written by idemproxy itself: a
// client that takes nothing of it would hold the handler, and the bytes
// it is written from, for as long as its connection lives. So every such
// write is bounded by client.write_timeout (a client that takes nothing
// for that long is cut), and what it is written from counts in
// limits.max_buffered_bytes against the principal while it is written.

// writeChunk is how much of an answer one deadline covers: a client that
// reads, however slowly, gets a new deadline every writeChunk bytes.
const writeChunk = 64 << 10

// writeAnswer writes b to the client through rc (x.w's) in parts, each
// within client.write_timeout, counting b in the buffer budget meanwhile.
// It returns the write's error (the client gone, or cut).
func (x *exchange) writeAnswer(rc *http.ResponseController, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	x.h.buffers.force(x.principal, len(b))
	defer x.h.buffers.give(x.principal, len(b))
	timeout := time.Duration(x.h.writeTimeout.Load())
	defer rc.SetWriteDeadline(time.Time{}) // unsupported writers: nothing to undo
	for len(b) > 0 {
		n := min(len(b), writeChunk)
		_ = rc.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := x.w.Write(b[:n]); err != nil {
			x.detail = "the client took nothing of the answer for client.write_timeout: cut"
			return err
		}
		b = b[n:]
	}
	return nil
}
