package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/syncbuf"
	"github.com/idemproxy/idemproxy/proxy"
)

// Routine lines wait for the tick; a warning goes out at once, after the
// lines before it, in order; stop writes what is held (issue 21: the
// access log off the request's path, anomalies never held back).
func TestLogBufferHoldsRoutineLinesOnly(t *testing.T) {
	var out syncbuf.Buffer
	lines := newLogBuffer(&out)
	log := slog.New(flushing{next: slog.NewJSONHandler(lines, nil), lines: lines})
	log.Info("first")
	log.Info("second")
	if got := out.String(); got != "" && !strings.Contains(got, "second") {
		t.Fatalf("a routine line went out alone, before the tick: %q", got)
	}
	log.Warn("anomaly")
	got := out.String()
	i, j, k := strings.Index(got, `"first"`), strings.Index(got, `"second"`), strings.Index(got, `"anomaly"`)
	if i < 0 || j < i || k < j {
		t.Fatalf("after a warning: %q, want first, second and the warning, in order", got)
	}
	log.Info("last")
	lines.stop()
	if !strings.Contains(out.String(), `"last"`) {
		t.Fatalf("stop did not write the held line: %q", out.String())
	}
}

// The binary's handler chain (leveled over flushing) takes the proxy's
// encoded request lines into the same buffer, in order with slog's; one
// with attributes added refuses them, so nothing it adds is lost.
func TestRequestLinesTakenEncoded(t *testing.T) {
	var out syncbuf.Buffer
	lines := newLogBuffer(&out)
	level := new(slog.LevelVar)
	h := leveled{next: flushing{next: slog.NewJSONHandler(lines, nil), lines: lines}, level: level}
	var lw proxy.LineWriter = h
	slog.New(h).Info("before")
	if !lw.WriteLine([]byte("{\"msg\":\"encoded\"}\n")) {
		t.Fatal("the binary's handler refused an encoded line")
	}
	slog.New(h).Warn("after")
	got := out.String()
	if i, j, k := strings.Index(got, `"before"`), strings.Index(got, `"encoded"`), strings.Index(got, `"after"`); i < 0 || j < i || k < j {
		t.Fatalf("lines out of order or lost: %q", got)
	}
	if h.WithAttrs([]slog.Attr{slog.String("pod", "a")}).(proxy.LineWriter).WriteLine([]byte("{}\n")) {
		t.Error("a handler with attributes of its own took an encoded line (it would lack them)")
	}
	lines.stop()
}

// A routine line goes out by itself, logFlushEvery after it came, with
// nothing else logged; once written nothing more is set to wake the
// process (the flush was a ticker, ten wake-ups a second when idle).
func TestLogBufferFlushesHeldLines(t *testing.T) {
	var out syncbuf.Buffer
	lines := newLogBuffer(&out)
	defer lines.stop()
	log := slog.New(flushing{next: slog.NewJSONHandler(lines, nil), lines: lines})
	log.Info("alone")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), `"alone"`) {
		if time.Now().After(deadline) {
			t.Fatal("a held routine line was never written")
		}
		time.Sleep(10 * time.Millisecond)
	}
	lines.mu.Lock()
	armed := lines.armed
	lines.mu.Unlock()
	if armed {
		t.Fatal("the flush timer is still set with nothing held")
	}
}
