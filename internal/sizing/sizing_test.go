package sizing

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// The worked table in docs/scaling.md is this model's output: the docs
// and `idemproxy size` share one source (issue 23).
func TestWorkedTableInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/scaling.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := Table(WorkedExamples()); !strings.Contains(string(doc), want) {
		t.Fatalf("docs/scaling.md does not hold the model's worked table; paste this under \"Worked examples\":\n%s", want)
	}
}

// One row worked by hand: 1,000 new keys/s for 1 h with 1 KiB answers.
func TestModelArithmetic(t *testing.T) {
	e := Size(Load{NewKeysPerSecond: 1000, Retention: time.Hour, ResponseBytes: 1024, ReplayRatio: 0.5})
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > want*1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// 3.6 M settled records plus 100 ms of claims in flight.
	near("records", e.Records, 3_600_000+100)
	// 160 for the key, a value of 240 + 1024 bytes in the 1,280-byte class.
	near("bytes per record", e.BytesPerRecord, 1440)
	near("memory", e.MemoryBytes, (3_600_000*1440+100*300)/0.7)
	// Claim + complete per key, half a replay, no renewal (100 ms < 10 s / 3).
	near("Redis ops/s", e.RedisOpsPerSecond, 2500)
	near("Redis cores", e.RedisCores, (1000*(11.8+15.1)+500*10.0)/1e6/0.5)
	if e.Shards != 1 || e.Binding != "memory" {
		t.Errorf("shards %d binding %s, want 1, memory", e.Shards, e.Binding)
	}
	// A slow upstream renews: 7 s with a 10 s lease is two renewals.
	slow := Size(Load{NewKeysPerSecond: 1000, Retention: time.Hour, UpstreamLatency: 7 * time.Second})
	near("Redis ops/s with renewals", slow.RedisOpsPerSecond, 2000+2000)
	// The compact layout: 89 + 2 + 2 + 1024 bytes, in the 1,280-byte class too.
	near("compact bytes at 1 KiB", Measured.RecordBytes(Load{ResponseBytes: 1024, Format: 3}), 160+1280)
	// Compressed at a given ratio: 93 + 308 bytes, in the 448-byte class.
	near("compressed at 0.3", Measured.RecordBytes(Load{ResponseBytes: 1024, Format: 3, Compression: true, CompressionRatio: 0.3}), 160+448)
	// Compression waits for record_format 3, and skips small answers.
	near("zstd under format 1", Measured.RecordBytes(Load{ResponseBytes: 1024, Compression: true, CompressionRatio: 0.3}), 1440)
	near("zstd on 100 bytes", Measured.RecordBytes(Load{ResponseBytes: 100, Format: 3, Compression: true}), 160+allocation(89+1+2+100))
}

// jemalloc's size classes as Redis allocates a string: 16-byte steps to
// 128, then four classes per doubling.
func TestAllocation(t *testing.T) {
	for n, want := range map[float64]float64{0: 16, 12: 16, 13: 32, 91: 96, 124: 128, 125: 160, 236: 256, 252: 256,
		253: 320, 1264: 1280, 1275: 1536, 4336: 5120, 16626: 20480, 65778: 81920} {
		if got := allocation(n); got != want {
			t.Errorf("allocation(%v) = %v, want %v", n, got, want)
		}
	}
}

func TestCheckRefusesNonsense(t *testing.T) {
	ok := Load{NewKeysPerSecond: 1, Retention: time.Hour}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]Load{
		"--new-keys-per-second": {NewKeysPerSecond: 0, Retention: time.Hour},
		"--retention":           {NewKeysPerSecond: 1, Retention: time.Millisecond},
		"--response-bytes":      {NewKeysPerSecond: 1, Retention: time.Hour, ResponseBytes: -1},
		"--replay-ratio":        {NewKeysPerSecond: 1, Retention: time.Hour, ReplayRatio: math.NaN()},
		"--fill":                {NewKeysPerSecond: 1, Retention: time.Hour, TargetFill: 2},
	} {
		if err := l.Check(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%+v: %v, want an error naming %s", l, err, name)
		}
	}
}

// TestStreamedAnswers (issue 44): a streamed answer costs one append per
// chunk and its end in Redis operations and CPU, and the sidecar's CPU per
// chunk; its record keeps the fixed layout, never compressed.
func TestStreamedAnswers(t *testing.T) {
	base := Load{NewKeysPerSecond: 10, Retention: time.Hour, ResponseBytes: 4096, Format: 4, Compression: true}
	streamed := base
	streamed.StreamChunks = 40
	b, s := Size(base), Size(streamed)
	if got := s.RedisOpsPerSecond - b.RedisOpsPerSecond; got != 10*41 {
		t.Errorf("Redis operations added by 40-chunk streams at 10/s = %v, want 410 (40 appends and an end each)", got)
	}
	if s.RedisCores <= b.RedisCores || s.SidecarCores <= b.SidecarCores {
		t.Errorf("streams cost no more Redis or sidecar CPU: %+v vs %+v", s, b)
	}
	if s.BytesPerRecord <= b.BytesPerRecord {
		t.Errorf("a streamed record (%v bytes) is no larger than a compressed compact one (%v): streams are never compressed", s.BytesPerRecord, b.BytesPerRecord)
	}
	// Sealed chunk by chunk: the head as a sealed record, 37 bytes per
	// chunk and for the end frame.
	plain := Load{ResponseBytes: 4096, Format: 4, StreamChunks: 40}
	sealed := plain
	sealed.Sealed = true
	want := Measured.KeyBytes + allocation(Measured.SealedBytes+5+2+37*41+4096)
	if got := Measured.RecordBytes(sealed); got != want || got <= Measured.RecordBytes(plain) {
		t.Errorf("a sealed 40-chunk streamed record = %v bytes, want %v (unsealed %v)", got, want, Measured.RecordBytes(plain))
	}
	if err := (Load{NewKeysPerSecond: 1, Retention: time.Hour, Format: 3, StreamChunks: 5}).Check(); err == nil {
		t.Error("--stream-chunks under format 3 accepted")
	}
}
