package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/syncbuf"
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
