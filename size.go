package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/sizing"
)

// runSize prints what a load needs of Redis and of the sidecars: the model
// and measured costs of docs/scaling.md ("Sizing"), one row of its table.
func runSize(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idemproxy size", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var l sizing.Load
	f := sizeFlags(fs, &l)
	compression, shard, path, store := f.compression, f.shard, f.path, f.store
	if help, err := parseFlags(fs, args, "size takes only flags"); help || err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["new-keys-per-second"] {
		return errors.New("size: --new-keys-per-second is required (first attempts per second, all routes and pods together)")
	}
	sb, err := config.ParseSize(*shard)
	if err != nil || sb <= 0 {
		return fmt.Errorf("size: --shard-memory: %q is not a size such as 25GiB", *shard)
	}
	l.ShardMemoryBytes = float64(sb)
	switch *compression {
	case config.CompressionNone, config.CompressionZstd:
		l.Compression = *compression == config.CompressionZstd
	default:
		return fmt.Errorf("size: --compression: %q is neither none nor zstd", *compression)
	}
	if *path != "" {
		cfg, err := config.Load(*path)
		if err != nil {
			return configError(*path, err)
		}
		fromConfig(&l, cfg, set)
	}
	if err := l.Check(); err != nil {
		return fmt.Errorf("size: %w", err)
	}
	if *path != "" && !set["store"] {
		if cfg, err := config.Load(*path); err == nil && cfg.Store.Postgres.URL != "" {
			*store = "postgres"
		}
	}
	switch *store {
	case "redis":
	case "postgres":
		if *f.checkpoint <= 0 {
			return fmt.Errorf("size: --checkpoint-interval must be positive, got %v", *f.checkpoint)
		}
		sizePostgres(l, *f.checkpoint, stdout)
		return nil
	default:
		return fmt.Errorf("size: --store: %q is neither redis nor postgres", *store)
	}
	e := sizing.Size(l)
	fmt.Fprint(stdout, sizing.TableHeader+e.Row())
	fmt.Fprintf(stdout, "\nBinds first: %s. Masters of %s at %.0f%% fill: %d for memory, %d for CPU (%.0f%% of a core each).\n",
		e.Binding, *shard, l.TargetFill*100, e.ShardsForMemory, e.ShardsForCPU, l.TargetCPU*100)
	fmt.Fprintf(stdout, "Redis: %.0f operations/s. Unit costs measured on one 2-core VM (docs/scaling.md, \"Sizing\"); re-measure on yours with `go run ./bench units`.\n", e.RedisOpsPerSecond)
	return nil
}

// sizeFlagValues are the string flags of idemproxy size.
type sizeFlagValues struct {
	compression, shard, path, store *string
	checkpoint                      *time.Duration
}

// sizeFlags declares idemproxy size's flags on fs, the load's into l.
func sizeFlags(fs *flag.FlagSet, l *sizing.Load) sizeFlagValues {
	var f sizeFlagValues
	fs.Float64Var(&l.NewKeysPerSecond, "new-keys-per-second", 0, "first attempts per second, all routes and pods together (required)")
	fs.DurationVar(&l.Retention, "retention", 24*time.Hour, "how long settled answers are kept (defaults.retention); with -config, its longest")
	fs.IntVar(&l.ResponseBytes, "response-bytes", 1024, "typical stored answer body; with -config, capped by its largest max_response_body")
	fs.Float64Var(&l.ReplayRatio, "replay-ratio", 0.1, "replays and retries per new key")
	fs.Float64Var(&l.PassThroughPerSecond, "pass-through-per-second", 0, "unprotected requests per second through the sidecars")
	fs.BoolVar(&l.Sealed, "sealed", false, "records sealed (store.encryption); with -config, whether it sets key_files")
	fs.IntVar(&l.Format, "record-format", 1, "store.record_format written (3: compact records; 4: streamed answers too; 5: on PostgreSQL their chunks as rows); with -config, its own")
	fs.IntVar(&l.StreamChunks, "stream-chunks", 0, "answers streamed as they arrive (routes[].stream, --record-format 4): chunks per answer, each one append (0: buffered answers)")
	f.compression = fs.String("compression", "none", "store.compression: none or zstd (under --record-format 3); with -config, its own")
	fs.Float64Var(&l.CompressionRatio, "compression-ratio", 0, "with zstd, compressed size / answer size for your answers (0: the ratios measured on JSON payment objects, docs/scaling.md)")
	fs.DurationVar(&l.Lease, "lease", 10*time.Second, "defaults.lease")
	fs.DurationVar(&l.UpstreamLatency, "upstream-latency", 100*time.Millisecond, "how long a first attempt's upstream call takes (renewals every lease/3 of it)")
	f.shard = fs.String("shard-memory", "25GiB", "one Redis master's maxmemory")
	fs.Float64Var(&l.TargetFill, "fill", 0.7, "share of maxmemory the records may fill")
	fs.Float64Var(&l.TargetCPU, "cpu-target", 0.5, "share of a master's core its commands may use")
	f.path = fs.String("config", "", "read retention, lease, max_response_body and sealing from this config")
	f.store = fs.String("store", "redis", "redis, or postgres: the PostgreSQL store's disk, WAL and writes instead of Redis' memory and masters; with -config, the store it configures")
	f.checkpoint = fs.Duration("checkpoint-interval", 5*time.Minute, "with --store postgres: how often the server checkpoints (checkpoint_timeout, unless max_wal_size forces them sooner); the first change of an index page after each is logged whole")
	return f
}

// fromConfig takes what a config says of the load, unless a flag said it:
// the longest retention and lease of its routes, its largest
// max_response_body as a cap on the answer, and sealing.
func fromConfig(l *sizing.Load, cfg *config.Config, set map[string]bool) {
	var retention, lease time.Duration
	var maxBody int64
	for _, r := range cfg.Routes {
		retention = max(retention, r.Settings.Retention)
		lease = max(lease, r.Settings.Lease)
		maxBody = max(maxBody, r.Settings.MaxResponseBody)
	}
	if len(cfg.Routes) == 0 {
		retention, lease, maxBody = cfg.Defaults.Retention, cfg.Defaults.Lease, cfg.Defaults.MaxResponseBody
	}
	if !set["retention"] {
		l.Retention = retention
	}
	if !set["lease"] {
		l.Lease = lease
	}
	if int64(l.ResponseBytes) > maxBody {
		l.ResponseBytes = int(maxBody) // a larger answer is stored without its body
	}
	if !set["sealed"] {
		l.Sealed = len(cfg.Store.Encryption.KeyFiles) > 0
	}
	if !set["record-format"] {
		l.Format = cfg.Store.RecordFormat
	}
	if !set["compression"] {
		l.Compression = cfg.Store.Compression == config.CompressionZstd
	}
}

// The PostgreSQL store's unit costs, measured with go run ./bench pgunits
// (20,000 keys, 1 KiB answers, PostgreSQL 15 with its defaults;
// docs/scaling.md): bytes on disk per settled record (the records table,
// its indexes and TOAST) and WAL per key over its life (claim,
// completion, expiry), each beyond the answer's body.
const (
	pgDiskPerRecord = 1747 - 1024
	pgWALPerKey     = 849 + 1635 + 147 - 1024

	// Full-page images (bench pgunits -existing N, docs/scaling.md): a
	// claim inserts into the key's index (pgKeyIndexBytes per record) at
	// a random place, as keys are hashes, and the first change of each
	// index page after a checkpoint logs the whole page (pgImageBytes,
	// and pgImageZstd times that under wal_compression = zstd). Claims
	// measured pgImagesPerTouch images for each first touch of a page the
	// model below counts (page splits log more): at 500,000 and 2,000,000
	// records, 1.02 and 1.22 images per claim against 0.74 and 0.92 first
	// touches.
	pgKeyIndexBytes  = 125
	pgImageBytes     = 6270
	pgImageZstd      = 0.41
	pgImagesPerTouch = 1.33

	// pgExpiryImageBytes: a record expires checkpoints after it was
	// written, so its delete is the first change of its heap page since
	// one, and the page (about five records of 1 KiB answers) is logged
	// whole: 0.17 pages of 7,700 bytes per key, measured over small and
	// large tables alike. A page's share per record grows with the
	// record, so it is scaled by the record's size on disk. Not counted
	// under zstd's factor: heap pages hold the answers, whose compression
	// is yours (the bench's bodies compress 14x).
	pgExpiryImageBytes = 1284
)

// pgImagesPerClaim is how many index pages a claim logs whole, on
// average, when records are held and perInterval claims come between two
// checkpoints: of P pages, perInterval random inserts touch
// P(1 - e^(-perInterval/P)) for the first time.
func pgImagesPerClaim(records, perInterval float64) float64 {
	pages := records * pgKeyIndexBytes / 8192
	if pages < 1 || perInterval <= 0 {
		return 0
	}
	return pgImagesPerTouch * pages / perInterval * (1 - math.Exp(-perInterval/pages))
}

// sizePostgres prints what load l asks of the PostgreSQL store, the
// server checkpointing every checkpoint: records held, disk, WAL and
// transactions per second.
func sizePostgres(l sizing.Load, checkpoint time.Duration, stdout io.Writer) {
	records := l.NewKeysPerSecond * l.Retention.Seconds()
	body := float64(l.ResponseBytes)
	disk := records * (pgDiskPerRecord + body)
	images := pgImagesPerClaim(records, l.NewKeysPerSecond*checkpoint.Seconds()) * pgImageBytes
	expiry := 0.0
	if l.Retention > checkpoint {
		expiry = pgExpiryImageBytes * (pgDiskPerRecord + body) / (pgDiskPerRecord + 1024)
	}
	perKey := pgWALPerKey + body + images + expiry
	wal := l.NewKeysPerSecond * perKey
	// A claim and a completion per new key, a renewal every lease/3 of
	// the upstream call, a read per replay.
	writes := l.NewKeysPerSecond * (2 + math.Floor(l.UpstreamLatency.Seconds()/(l.Lease.Seconds()/3)))
	reads := l.NewKeysPerSecond * l.ReplayRatio
	fmt.Fprintf(stdout, "PostgreSQL store: %.0f new keys/s kept %s (%.0f-byte answers)\n", l.NewKeysPerSecond, l.Retention, body)
	fmt.Fprintf(stdout, "  records held: %.0f\n", records)
	fmt.Fprintf(stdout, "  disk (table, indexes, TOAST): %s, at %.0f bytes per record\n", humanBytes(disk), pgDiskPerRecord+body)
	fmt.Fprintf(stdout, "  WAL: %s/s, at %.0f bytes per key (claim, completion, expiry; pages logged whole at their first change after each checkpoint, every %v: %.0f bytes of the key's index at the claim, %.0f of the table at the expiry; vacuum's own not counted)\n",
		humanBytes(wal), perKey, checkpoint, images, expiry)
	fmt.Fprintf(stdout, "  WAL with wal_compression = zstd (index pages %.2f× as large): %s/s\n", pgImageZstd, humanBytes(l.NewKeysPerSecond*(perKey-images*(1-pgImageZstd))))
	fmt.Fprintf(stdout, "  writes: %.0f transactions/s (each a commit); replays: %.0f reads/s\n", writes, reads)
	fmt.Fprintln(stdout, "Unit costs measured on one 2-core VM with PostgreSQL 15 (docs/scaling.md); re-measure on yours with `go run ./bench pgunits`.")
}

// humanBytes is n bytes in KiB, MiB, GiB or TiB.
func humanBytes(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}
