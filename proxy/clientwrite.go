package proxy

import (
	"errors"
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
// The last part is flushed under its deadline too: what the server's
// buffer still held would otherwise go out after the deadline is lifted.
func (x *exchange) writeAnswer(rc *http.ResponseController, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	x.p.buffers.force(x.bufs.holder, len(b))
	defer x.p.buffers.give(x.bufs.holder, len(b))
	timeout := time.Duration(x.h.writeTimeout.Load())
	// A writer without deadlines (a test's recorder) says so once.
	deadlines := rc.SetWriteDeadline(time.Now().Add(timeout)) == nil
	if deadlines {
		defer rc.SetWriteDeadline(time.Time{})
	}
	var err error
	for first := true; len(b) > 0 && err == nil; first = false {
		n := min(len(b), writeChunk)
		if deadlines && !first {
			_ = rc.SetWriteDeadline(time.Now().Add(timeout))
		}
		_, err = x.w.Write(b[:n])
		b = b[n:]
	}
	if err == nil {
		if err = rc.Flush(); errors.Is(err, http.ErrNotSupported) {
			err = nil
		}
	}
	return err
}

// detailCut is a request-line detail: the client was cut by
// client.write_timeout.
const detailCut = "the client took nothing of the answer for client.write_timeout: cut"
