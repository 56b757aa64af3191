package proxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"reflect"
	"testing"
	"time"
)

// lineCatcher takes encoded lines, as the binary's handler does.
type lineCatcher struct {
	slog.Handler
	lines bytes.Buffer
}

func (c *lineCatcher) WriteLine(line []byte) bool { c.lines.Write(line); return true }

// The request line encoded by hand reads as slog.JSONHandler's would,
// field for field, whatever the strings hold.
func TestRequestLineMatchesSlog(t *testing.T) {
	for _, l := range []requestLine{
		{route: "pay", outcome: "executed", status: 201, requestID: "0123456789abcdef0123456789abcdef", duration: 1234567, upstream: 234567, key: "idem:ab"},
		{route: "r", outcome: "replayed", status: 200, requestID: `quote" back\ <tag>&amp;`, duration: 1, original: "orig", late: true,
			detail: "tab\tnl\ncr\rnul\x00bell\x07 del\x7f ünïcödé \xff\xfe broken \u2028 sep"},
		{route: "r", outcome: "rejected", status: 400},
	} {
		var slogged bytes.Buffer
		l.log(slog.New(slog.NewJSONHandler(&slogged, nil)), slog.LevelInfo) // a plain handler: slog encodes
		c := &lineCatcher{Handler: slog.NewJSONHandler(&bytes.Buffer{}, nil)}
		l.log(slog.New(c), slog.LevelInfo)
		if c.lines.Len() == 0 {
			t.Fatal("a LineWriter was not given the line")
		}
		var want, got map[string]any
		if err := json.Unmarshal(slogged.Bytes(), &want); err != nil {
			t.Fatalf("slog's line %q: %v", slogged.String(), err)
		}
		if err := json.Unmarshal(c.lines.Bytes(), &got); err != nil {
			t.Fatalf("the encoded line %q is not JSON: %v", c.lines.String(), err)
		}
		for _, m := range []map[string]any{want, got} {
			ts, err := time.Parse(time.RFC3339, m["time"].(string))
			if err != nil || time.Since(ts) > time.Minute {
				t.Errorf("time %v: %v", m["time"], err)
			}
			delete(m, "time")
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("encoded line differs from slog's:\n got %s\nwant %s", c.lines.String(), slogged.String())
		}
		if !bytes.HasSuffix(c.lines.Bytes(), []byte("}\n")) {
			t.Errorf("the line does not end in a newline: %q", c.lines.String())
		}
	}
}

// A handler that refuses the line (it adds attributes of its own) gets it
// through slog.
func TestRequestLineRefused(t *testing.T) {
	var out bytes.Buffer
	h := refusing{slog.NewJSONHandler(&out, nil)}
	l := requestLine{route: "pay", outcome: "executed", status: 201}
	l.log(slog.New(h), slog.LevelInfo)
	if !bytes.Contains(out.Bytes(), []byte(`"route":"pay"`)) {
		t.Fatalf("refused line not logged through slog: %q", out.String())
	}
}

type refusing struct{ slog.Handler }

func (refusing) WriteLine([]byte) bool { return false }

// BenchmarkRequestLine is the request line by hand against slog's encoder.
func BenchmarkRequestLine(b *testing.B) {
	l := requestLine{route: "pay", outcome: "executed", status: 201, requestID: "0123456789abcdef0123456789abcdef",
		duration: 1234567, upstream: 234567, key: "idem:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	b.Run("encoded", func(b *testing.B) {
		logger := slog.New(discardLines{slog.DiscardHandler})
		b.ReportAllocs()
		for b.Loop() {
			l.log(logger, slog.LevelInfo)
		}
	})
	b.Run("slog", func(b *testing.B) {
		logger := slog.New(slog.NewJSONHandler(discard{}, nil))
		b.ReportAllocs()
		for b.Loop() {
			l.log(logger, slog.LevelInfo)
		}
	})
}

type discardLines struct{ slog.Handler }

func (discardLines) WriteLine([]byte) bool { return true }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
