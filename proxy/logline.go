package proxy

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// The request line. Every protected request logs one line at info; slog's
// generic encoder walks its attributes through reflection-free but
// general code (an Attr slice, a Value per field, a handler state) that
// costs more than the line needs. A handler that implements LineWriter
// takes the line encoded here instead, as JSON with the fields
// slog.JSONHandler writes (time to the millisecond, level, msg, then the
// request's fields; durations in nanoseconds). Warnings and errors go
// through slog as before: they are rare, and a handler may act on their
// level (the binary's writes them out at once).

// LineWriter is implemented by a slog.Handler that may accept a whole
// JSON log line (ending in a newline) at info level, already encoded: it
// reports false, writing nothing, when it cannot take it as it is (it
// adds attributes or groups of its own, or writes elsewhere), and the
// line goes through slog. The handler must not keep line.
type LineWriter interface {
	WriteLine(line []byte) bool
}

var linePool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// requestLine is one request's line: its fields in the order they are
// written.
type requestLine struct {
	route, outcome, requestID, key, original, detail string
	// traceID, when tracing is on, is the request's trace.
	traceID            string
	status             int
	duration, upstream time.Duration
	late               bool
}

// log writes l at level through h's logger: encoded here when its
// handler is a LineWriter and the level is info, by slog otherwise.
func (l *requestLine) log(logger *slog.Logger, level slog.Level) {
	if lw, ok := logger.Handler().(LineWriter); ok && level == slog.LevelInfo {
		buf := linePool.Get().(*[]byte)
		*buf = l.appendJSON((*buf)[:0], time.Now())
		written := lw.WriteLine(*buf)
		if cap(*buf) <= 4<<10 {
			linePool.Put(buf)
		}
		if written {
			return
		}
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("route", l.route),
		slog.String("outcome", l.outcome),
		slog.Int("status", l.status),
		slog.String("request_id", l.requestID),
		slog.Duration("duration", l.duration),
	)
	if l.traceID != "" {
		attrs = append(attrs, slog.String("trace_id", l.traceID))
	}
	if l.upstream > 0 {
		attrs = append(attrs, slog.Duration("upstream", l.upstream))
	}
	if l.key != "" {
		attrs = append(attrs, slog.String("key", l.key))
	}
	if l.original != "" {
		attrs = append(attrs, slog.String("original_request_id", l.original))
	}
	if l.late {
		attrs = append(attrs, slog.Bool("late", true))
	}
	if l.detail != "" {
		attrs = append(attrs, slog.String("detail", l.detail))
	}
	logger.LogAttrs(context.Background(), level, "request", attrs...)
}

// appendJSON appends l as slog.JSONHandler would write it at info.
func (l *requestLine) appendJSON(b []byte, now time.Time) []byte {
	b = append(b, `{"time":"`...)
	b = now.AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
	b = append(b, `","level":"INFO","msg":"request","route":`...)
	b = appendJSONString(b, l.route)
	b = append(b, `,"outcome":`...)
	b = appendJSONString(b, l.outcome)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(l.status), 10)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, l.requestID)
	b = append(b, `,"duration":`...)
	b = strconv.AppendInt(b, int64(l.duration), 10)
	if l.traceID != "" {
		b = append(b, `,"trace_id":`...)
		b = appendJSONString(b, l.traceID)
	}
	if l.upstream > 0 {
		b = append(b, `,"upstream":`...)
		b = strconv.AppendInt(b, int64(l.upstream), 10)
	}
	if l.key != "" {
		b = append(b, `,"key":`...)
		b = appendJSONString(b, l.key)
	}
	if l.original != "" {
		b = append(b, `,"original_request_id":`...)
		b = appendJSONString(b, l.original)
	}
	if l.late {
		b = append(b, `,"late":true`...)
	}
	if l.detail != "" {
		b = append(b, `,"detail":`...)
		b = appendJSONString(b, l.detail)
	}
	return append(b, "}\n"...)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced, as slog does.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
