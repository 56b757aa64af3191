// Package sizing is the capacity model of docs/scaling.md ("Sizing"):
// records held, Redis memory and CPU, shards, sidecar CPU and network for
// a given load, from unit costs measured on one machine. The docs' worked
// table and `idemproxy size` both come from here (TestWorkedTableInDocs).
package sizing

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Measured are the unit costs, measured on a 2-core VM (Intel Xeon), Redis
// 7.0.15, go1.26.8, on 2026-12-01:
//
//	go run ./bench units                  # Redis CPU, network bytes per operation; bytes per record
//	go run ./bench -rounds 3 ...          # sidecar CPU per request (docs/benchmarks.md)
//
// Redis figures are pipelined (32 operations at once, store.pipeline: true,
// the default); serial ones are 2–3× higher (docs/scaling.md).
var Measured = Costs{
	RedisClaimMicros:    11.8,
	RedisCompleteMicros: 15.1,
	RedisReplayMicros:   10.0,
	RedisRenewMicros:    12.0,
	// Redis memory per completed record (`go run ./bench units`, its
	// check against used_memory): KeyBytes for the key, its entries in
	// the main and expires tables and their buckets, plus the value's
	// allocation, jemalloc's size class of the value and its string
	// header. The value is the stored body and the record's own bytes
	// (4 headers, a 32-byte request id), besides the body's length as
	// each layout writes it twice (lengthBytes): 234 in the fixed layout
	// (store.record_format 1 and 2), 89 in the compact one (3), 268
	// sealed (which keeps the fixed layout).
	KeyBytes:      160,
	FixedBytes:    234,
	CompactBytes:  89,
	SealedBytes:   268,
	CompressAbove: 256,
	// zstd on JSON answers as legacy APIs give them (bench: jsonBody,
	// payment objects with every id, amount and time their own): the
	// compressed size by answer size. Past the last point, its ratio.
	Compressed: []Point{{256, 150}, {1151, 365}, {2276, 486}, {3401, 601}, {4152, 672}, {8288, 1050}, {16648, 1814}, {65862, 6473}},
	// An in-progress claim, held for the upstream call.
	InProgressBytes: 300,
	// Network bytes per operation besides the answer itself (INFO stats,
	// in + out): a claim, a completion, a replay read.
	NetClaimBytes:    289,
	NetCompleteBytes: 456,
	NetReplayBytes:   497,
	// Sidecar CPU per request, all of the process (bench harness, c=32,
	// 0 ms upstream, 1 KiB answers; docs/benchmarks-history.md, the run
	// of 2026-12-03, three rounds, beside v0.5.0).
	SidecarFirstAttemptMicros: 166,
	SidecarReplayMicros:       77,
	SidecarPassThroughMicros:  87,
	// One streamed event through the sidecar (go run ./bench stream: 20
	// events of 200 bytes per stream, each stream's claim and connection
	// spread over its events; docs/benchmarks-history.md).
	SidecarStreamChunkMicros: 405,
}

// Costs are the unit costs the model multiplies.
type Costs struct {
	RedisClaimMicros, RedisCompleteMicros, RedisReplayMicros, RedisRenewMicros float64
	KeyBytes, FixedBytes, CompactBytes, SealedBytes                            float64
	CompressAbove                                                              int
	Compressed                                                                 []Point
	InProgressBytes                                                            float64
	NetClaimBytes, NetCompleteBytes, NetReplayBytes                            float64
	SidecarFirstAttemptMicros, SidecarReplayMicros, SidecarPassThroughMicros   float64
	SidecarStreamChunkMicros                                                   float64
}

// Point is one measurement: an answer of Size bytes took Bytes.
type Point struct{ Size, Bytes float64 }

// Load is what the model sizes for.
type Load struct {
	NewKeysPerSecond float64
	Retention        time.Duration
	// ResponseBytes is the stored answer's body (capped by the route's
	// max_response_body: a larger answer is stored without it).
	ResponseBytes int
	// ReplayRatio is replays (and retries) per new key.
	ReplayRatio float64
	// PassThroughPerSecond is unprotected traffic through the sidecars.
	PassThroughPerSecond float64
	Sealed               bool
	// Format is store.record_format (3: compact records); Compression
	// is store.compression: zstd (under Format 3), which shrinks answers
	// of CompressThreshold bytes or more to CompressionRatio of their
	// size.
	Format      int
	Compression bool
	// StreamChunks, when set (under Format 4), is the chunks of a
	// streamed answer (routes[].stream): each is one append, and the
	// record keeps the fixed layout, never compressed.
	StreamChunks     int
	CompressionRatio float64
	Lease            time.Duration
	// UpstreamLatency is how long a first attempt holds its claim: a
	// renewal every lease/3 of it.
	UpstreamLatency time.Duration
	// ShardMemoryBytes is one master's maxmemory; TargetFill the share of
	// it the records may take (the rest: fragmentation, replication
	// buffers, AOF rewrite); TargetCPU the share of a master's one core
	// the commands may take.
	ShardMemoryBytes      float64
	TargetFill, TargetCPU float64
}

// withDefaults fills what a Load leaves zero.
func (l Load) withDefaults() Load {
	if l.Lease == 0 {
		l.Lease = 10 * time.Second
	}
	if l.UpstreamLatency == 0 {
		l.UpstreamLatency = 100 * time.Millisecond
	}
	if l.ShardMemoryBytes == 0 {
		l.ShardMemoryBytes = 25 << 30
	}
	if l.TargetFill == 0 {
		l.TargetFill = 0.7
	}
	if l.TargetCPU == 0 {
		l.TargetCPU = 0.5
	}
	return l
}

// Check refuses a load the model cannot size, naming the flag.
func (l Load) Check() error {
	var errs []error
	if !(l.NewKeysPerSecond > 0) || math.IsInf(l.NewKeysPerSecond, 0) {
		errs = append(errs, fmt.Errorf("--new-keys-per-second must be a positive number, got %v", l.NewKeysPerSecond))
	}
	if l.Retention < time.Second {
		errs = append(errs, fmt.Errorf("--retention must be at least 1s, got %s", l.Retention))
	}
	if l.ResponseBytes < 0 || l.ResponseBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("--response-bytes must be between 0 and 64MiB, got %d", l.ResponseBytes))
	}
	if l.ReplayRatio < 0 || l.ReplayRatio > 1000 || math.IsNaN(l.ReplayRatio) {
		errs = append(errs, fmt.Errorf("--replay-ratio must be between 0 and 1000 replays per new key, got %v", l.ReplayRatio))
	}
	if l.PassThroughPerSecond < 0 || math.IsNaN(l.PassThroughPerSecond) {
		errs = append(errs, fmt.Errorf("--pass-through-per-second must not be negative, got %v", l.PassThroughPerSecond))
	}
	if l.Format < 0 || l.Format > 4 {
		errs = append(errs, fmt.Errorf("--record-format must be 1, 2, 3 or 4, got %d", l.Format))
	}
	if l.StreamChunks < 0 || l.StreamChunks > 0 && l.Format < 4 {
		errs = append(errs, fmt.Errorf("--stream-chunks needs --record-format 4 (streams are buffered below it) and must not be negative, got %d", l.StreamChunks))
	}
	if l.CompressionRatio < 0 || l.CompressionRatio > 1 || math.IsNaN(l.CompressionRatio) {
		errs = append(errs, fmt.Errorf("--compression-ratio must be between 0 and 1, got %v", l.CompressionRatio))
	}
	if l.Lease < 0 || l.UpstreamLatency < 0 {
		errs = append(errs, errors.New("--lease and --upstream-latency must not be negative"))
	}
	if l.ShardMemoryBytes < 0 || l.TargetFill < 0 || l.TargetFill > 1 || l.TargetCPU < 0 || l.TargetCPU > 1 {
		errs = append(errs, errors.New("--shard-memory must be positive, --fill and --cpu-target between 0 and 1"))
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// Estimate is what a Load needs.
type Estimate struct {
	Load Load
	// Records are held at once: new keys/s × retention, plus claims in
	// flight.
	Records        float64
	BytesPerRecord float64
	// MemoryBytes is records × bytes per record ÷ the target fill.
	MemoryBytes float64
	// RedisOpsPerSecond and RedisCores: claims, completions, replay
	// reads and renewals; CPU ÷ the target utilisation.
	RedisOpsPerSecond, RedisCores float64
	// Shards is the larger of what memory and CPU need; Binding says
	// which.
	ShardsForMemory, ShardsForCPU, Shards int
	Binding                               string
	// SidecarCores is the sidecars' CPU, all pods together.
	SidecarCores float64
	// NetworkBytesPerSecond is between the sidecars and Redis.
	NetworkBytesPerSecond float64
}

// Size runs the model with the measured costs.
func Size(l Load) Estimate { return Measured.Size(l) }

// Size runs the model.
func (c Costs) Size(l Load) Estimate {
	l = l.withDefaults()
	e := Estimate{Load: l}
	e.BytesPerRecord = c.RecordBytes(l)
	inFlight := l.NewKeysPerSecond * l.UpstreamLatency.Seconds()
	e.Records = l.NewKeysPerSecond*l.Retention.Seconds() + inFlight
	e.MemoryBytes = (l.NewKeysPerSecond*l.Retention.Seconds()*e.BytesPerRecord + inFlight*c.InProgressBytes) / l.TargetFill
	renewals := l.NewKeysPerSecond * math.Floor(l.UpstreamLatency.Seconds()/(l.Lease.Seconds()/3))
	replays := l.NewKeysPerSecond * l.ReplayRatio
	// A streamed answer: its head replaces the claim (as a completion
	// does), then one fenced append per chunk and its end.
	appends := l.NewKeysPerSecond * float64(l.StreamChunks+min(l.StreamChunks, 1))
	e.RedisOpsPerSecond = 2*l.NewKeysPerSecond + replays + renewals + appends
	redisMicros := l.NewKeysPerSecond*(c.RedisClaimMicros+c.RedisCompleteMicros) + replays*c.RedisReplayMicros + renewals*c.RedisRenewMicros + appends*c.RedisCompleteMicros
	e.RedisCores = redisMicros / 1e6 / l.TargetCPU
	e.ShardsForMemory = max(1, int(math.Ceil(e.MemoryBytes/l.ShardMemoryBytes)))
	e.ShardsForCPU = max(1, int(math.Ceil(e.RedisCores)))
	e.Shards, e.Binding = e.ShardsForMemory, "memory"
	if e.ShardsForCPU > e.ShardsForMemory {
		e.Shards, e.Binding = e.ShardsForCPU, "Redis CPU"
	}
	e.SidecarCores = (l.NewKeysPerSecond*c.SidecarFirstAttemptMicros + replays*c.SidecarReplayMicros + l.PassThroughPerSecond*c.SidecarPassThroughMicros +
		l.NewKeysPerSecond*float64(l.StreamChunks)*c.SidecarStreamChunkMicros) / 1e6
	answer := float64(l.ResponseBytes)
	e.NetworkBytesPerSecond = l.NewKeysPerSecond*(c.NetClaimBytes+c.NetCompleteBytes+answer) + replays*(c.NetReplayBytes+answer)
	return e
}

// RecordBytes is the Redis memory one completed record of l takes.
func (c Costs) RecordBytes(l Load) float64 {
	n := uint64(l.ResponseBytes)
	// The fixed layout writes the length as the body's varint and as
	// Content-Length's decimal digits; the compact one as two varints.
	own := c.FixedBytes + float64(varintLen(n)+len(strconv.FormatUint(n, 10)))
	streamed := l.StreamChunks > 0
	switch {
	case streamed && l.Sealed:
		// The head sealed as a buffered record is, and each chunk, and
		// the end, a frame of 37 bytes more than its chunk.
		own = c.SealedBytes + 5 + float64(varintLen(n)) + sealedFrameBytes*float64(l.StreamChunks+1)
	case streamed:
		own = c.FixedBytes + 5 + float64(varintLen(n)) // the end byte and the head's length
	case l.Sealed:
		own += c.SealedBytes - c.FixedBytes
	case l.Format >= 3:
		own = c.CompactBytes + float64(varintLen(n)+varintLen(n<<3|1))
	}
	body := float64(l.ResponseBytes)
	if l.Compression && l.Format >= 3 && !streamed && l.ResponseBytes >= c.CompressAbove {
		if l.CompressionRatio > 0 {
			body *= l.CompressionRatio
		} else {
			body = interpolate(c.Compressed, body)
		}
	}
	return c.KeyBytes + allocation(own+math.Ceil(body))
}

// sealedFrameBytes is what sealing adds to each chunk of a streamed
// answer (claim/streamseal.go: kind, length, key id, nonce, GCM tag).
const sealedFrameBytes = 1 + 4 + 4 + 12 + 16

func varintLen(n uint64) int {
	return len(binary.AppendUvarint(nil, n))
}

// allocation is what jemalloc hands Redis for a string value of n bytes:
// n, Redis' string header (3, 5 or 9 bytes by length) and a terminating
// NUL, rounded up to the allocator's size class (four classes per
// doubling from 128 bytes on, 16-byte steps below).
func allocation(n float64) float64 {
	switch {
	case n < 1<<8:
		n += 4
	case n < 1<<16:
		n += 6
	default:
		n += 10
	}
	if n <= 128 {
		return math.Ceil(n/16) * 16
	}
	step := math.Exp2(math.Floor(math.Log2(n-1)) - 2)
	return math.Ceil(n/step) * step
}

// interpolate reads points at size: linear between them, and past the
// last at its ratio.
func interpolate(points []Point, size float64) float64 {
	if size <= points[0].Size {
		return points[0].Bytes * size / points[0].Size
	}
	for i := 1; i < len(points); i++ {
		a, b := points[i-1], points[i]
		if size <= b.Size {
			return a.Bytes + (size-a.Size)*(b.Bytes-a.Bytes)/(b.Size-a.Size)
		}
	}
	last := points[len(points)-1]
	return size * last.Bytes / last.Size
}

// WorkedExamples are docs/scaling.md's table: 100 to 100,000 new keys/s,
// 1 h and 24 h retention, 1 KiB and 16 KiB answers, replay ratio 0.1,
// unsealed.
func WorkedExamples() []Load {
	var out []Load
	for _, rate := range []float64{100, 1000, 10000, 100000} {
		for _, retention := range []time.Duration{time.Hour, 24 * time.Hour} {
			for _, size := range []int{1024, 16384} {
				out = append(out, Load{NewKeysPerSecond: rate, Retention: retention, ResponseBytes: size, ReplayRatio: 0.1})
			}
		}
	}
	return out
}

// TableHeader heads Row's lines.
const TableHeader = "| new keys/s | retention | answer | records held | Redis memory per record | maxmemory needed (at --fill) | Redis CPU | masters (memory / CPU) | binds first | sidecar CPU | network |\n|---|---|---|---|---|---|---|---|---|---|---|\n"

// Row is an Estimate as a line of the table.
func (e Estimate) Row() string {
	return fmt.Sprintf("| %s | %s | %s | %s | %s B | %s | %.2f cores | %d (%d / %d) | %s | %.2f cores | %s/s |\n",
		count(e.Load.NewKeysPerSecond), duration(e.Load.Retention), bytes(float64(e.Load.ResponseBytes)), count(e.Records), count(math.Round(e.BytesPerRecord)),
		bytes(e.MemoryBytes), e.RedisCores, e.Shards, e.ShardsForMemory, e.ShardsForCPU, e.Binding, e.SidecarCores, bytes(e.NetworkBytesPerSecond))
}

// Table is the worked table: each load as it is, then its bytes per
// record and masters with record_format 3 and zstd (JSON answers at the
// measured ratios).
func Table(loads []Load) string {
	var b strings.Builder
	b.WriteString(strings.Replace(TableHeader, " network |\n|", " network | zstd: memory per record | zstd: masters |\n|---|---|", 1))
	for _, l := range loads {
		row := Size(l).Row()
		l.Format, l.Compression = 3, true
		z := Size(l)
		fmt.Fprintf(&b, "%s %s B | %d |\n", strings.TrimSuffix(row, "\n"), count(math.Round(z.BytesPerRecord)), z.Shards)
	}
	return b.String()
}

func count(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2f G", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1f M", v/1e6)
	}
	if v < 10 && v != math.Trunc(v) {
		return fmt.Sprintf("%.2f", v)
	}
	digits := fmt.Sprintf("%.0f", v)
	for i := len(digits) - 3; i > 0; i -= 3 {
		digits = digits[:i] + "," + digits[i:]
	}
	return digits
}

func bytes(v float64) string {
	switch {
	case v >= 1<<40:
		return fmt.Sprintf("%.1f TiB", v/(1<<40))
	case v >= 1<<30:
		return fmt.Sprintf("%.1f GiB", v/(1<<30))
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.0f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

func duration(d time.Duration) string {
	if d >= 48*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}
