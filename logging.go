package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/proxy"
)

// Routine log lines (a request's line, at info) are written in batches, so
// that a request never waits for a write to stderr: they are held at most
// logFlushEvery, or until logBufferSize bytes wait. A warning or an error
// goes out at once, after every line before it, so that anomalies are never
// held back. What a kill -9 loses: the routine lines of the last
// logFlushEvery at most; a normal exit (SIGTERM, a start-up error) writes
// everything. The flush is a timer set when a line comes to an empty
// buffer, not a ticker: an idle sidecar is not woken ten times a second.
const (
	logFlushEvery = 100 * time.Millisecond
	logBufferSize = 64 << 10
)

// logBuffer holds lines for w and writes them out logFlushEvery after the
// first of them.
type logBuffer struct {
	mu      sync.Mutex // guards what follows and writes to w, in order
	w       io.Writer
	buf     []byte
	timer   *time.Timer
	armed   bool // timer is set: lines are held
	stopped bool
}

func newLogBuffer(w io.Writer) *logBuffer {
	b := &logBuffer{w: w, buf: make([]byte, 0, logBufferSize)}
	b.timer = time.AfterFunc(time.Hour, b.flush)
	b.timer.Stop()
	return b
}

// Write holds p (one whole line from the JSON handler).
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf)+len(p) > logBufferSize {
		b.flushLocked()
	}
	if len(p) > logBufferSize || b.stopped {
		return b.w.Write(p)
	}
	b.buf = append(b.buf, p...)
	if !b.armed {
		b.armed = true
		b.timer.Reset(logFlushEvery)
	}
	return len(p), nil
}

func (b *logBuffer) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
}

// flushLocked writes what is held (b.mu held); the timer fires for
// nothing when it was set.
func (b *logBuffer) flushLocked() {
	if len(b.buf) > 0 {
		_, _ = b.w.Write(b.buf) // stderr: nowhere to report a failed write
		b.buf = b.buf[:0]
	}
	b.armed = false
}

// stop writes what is held; lines after it are written at once.
func (b *logBuffer) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	b.timer.Stop()
	b.flushLocked()
}

// flushing writes a warning or an error, and everything held before it,
// at once.
type flushing struct {
	next  slog.Handler
	lines *logBuffer
	// derived: attributes or groups were added (WithAttrs, WithGroup), so
	// a line encoded elsewhere would lack them.
	derived bool
}

// WriteLine takes a request line the proxy encoded (proxy.LineWriter),
// held like every routine line.
func (h flushing) WriteLine(line []byte) bool {
	if h.derived {
		return false
	}
	_, _ = h.lines.Write(line)
	return true
}

func (h flushing) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h flushing) Handle(ctx context.Context, r slog.Record) error {
	err := h.next.Handle(ctx, r)
	if r.Level >= slog.LevelWarn {
		h.lines.flush()
	}
	return err
}

func (h flushing) WithAttrs(as []slog.Attr) slog.Handler {
	return flushing{next: h.next.WithAttrs(as), lines: h.lines, derived: true}
}

func (h flushing) WithGroup(name string) slog.Handler {
	return flushing{next: h.next.WithGroup(name), lines: h.lines, derived: true}
}

// leveled filters a handler by a level that a reload can change.
type leveled struct {
	next  slog.Handler
	level *slog.LevelVar
}

func (h leveled) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level.Level() && h.next.Enabled(ctx, l)
}

func (h leveled) Handle(ctx context.Context, r slog.Record) error { return h.next.Handle(ctx, r) }

// WriteLine passes an encoded info line on when the handler it wraps
// takes one (proxy.LineWriter); the caller checked the level.
func (h leveled) WriteLine(line []byte) bool {
	lw, ok := h.next.(proxy.LineWriter)
	return ok && lw.WriteLine(line)
}

func (h leveled) WithAttrs(as []slog.Attr) slog.Handler {
	return leveled{next: h.next.WithAttrs(as), level: h.level}
}

func (h leveled) WithGroup(name string) slog.Handler {
	return leveled{next: h.next.WithGroup(name), level: h.level}
}
