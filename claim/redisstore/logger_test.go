package redisstore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestSlogLoggerLogsAMessageOncePer10s (issue 79): go-redis' failed dials
// while Redis refuses connections come several a second; each message is
// logged at most once per logEvery, the next line counting the ones left
// out, and another message is not held back by it.
func TestSlogLoggerLogsAMessageOncePer10s(t *testing.T) {
	var buf bytes.Buffer
	l := NewSlogLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	now := time.Unix(1_700_000_000, 0)
	l.now = func() time.Time { return now }
	ctx := context.Background()
	for range 40 { // 10 s at four a second
		l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, "connection refused")
		now = now.Add(250 * time.Millisecond)
	}
	l.Printf(ctx, "redis: discarding bad PubSub connection: %v", "EOF")
	l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, "connection refused")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (the dial failure, the other message, the dial failure 10 s later):\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[1], "PubSub") || !strings.Contains(lines[2], `"repeats_not_logged":39`) {
		t.Errorf("want the other message at once and the dial failure again counting 39 left out:\n%s", buf.String())
	}
}
