package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"strings"
	"testing"
)

// `idemproxy size` prints a row of docs/scaling.md's worked table exactly,
// and refuses nonsense with a message naming the flag (issue 23).
func TestSizeReproducesTheDocsRow(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"size", "--new-keys-per-second", "10000", "--retention", "24h", "--response-bytes", "1024"}, &out, &errb)
	if err != nil {
		t.Fatal(err, errb.String())
	}
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[2], "| 10,000 | 24h | 1 KiB |") {
		t.Fatalf("size printed:\n%s", out.String())
	}
	doc, err := os.ReadFile("docs/scaling.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), "\n"+lines[2]+" ")
	if i < 0 {
		t.Fatalf("docs/scaling.md's worked table has no row\n%s", lines[2])
	}
	if !strings.Contains(out.String(), "Binds first: memory.") {
		t.Errorf("size does not say what binds first:\n%s", out.String())
	}
	// The docs row goes on with the same load's bytes per record and
	// masters under record_format 3 and zstd: what size says for them.
	docRow, _, _ := strings.Cut(string(doc)[i+1:], "\n")
	out.Reset()
	if err := run(context.Background(), []string{"size", "--new-keys-per-second", "10000", "--retention", "24h", "--response-bytes", "1024", "--record-format", "3", "--compression", "zstd"}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	cells := strings.Split(strings.Split(out.String(), "\n")[2], " | ")
	docCells := strings.Split(docRow, " | ")
	if len(cells) < 8 || len(docCells) < 13 || docCells[11] != cells[4] || docCells[12] != strings.Fields(cells[7])[0]+" |" {
		t.Errorf("size with record_format 3 and zstd:\n%s\ndocs' row:\n%s", out.String(), docRow)
	}
}

func TestSizeRefusesNonsense(t *testing.T) {
	for args, want := range map[string]string{
		"":                         "--new-keys-per-second is required",
		"--new-keys-per-second -5": "--new-keys-per-second must be a positive number",
		"--new-keys-per-second 10 --retention 1ms":            "--retention must be at least 1s",
		"--new-keys-per-second 10 --shard-memory lots":        "--shard-memory",
		"--new-keys-per-second 10 --compression lz4":          "--compression",
		"--new-keys-per-second 10 --compression-ratio 2":      "--compression-ratio must be between 0 and 1",
		"--new-keys-per-second 10 --record-format 7":          "--record-format must be 1, 2, 3 or 4",
		"--new-keys-per-second 10 -config testdata/nope.yaml": "nope.yaml",
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), append([]string{"size"}, strings.Fields(args)...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("size %s: %v, want an error containing %q", args, err, want)
		}
	}
}

// With -config, retention, lease, the answer cap and sealing come from the
// file unless a flag says otherwise.
func TestSizeReadsTheConfig(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"size", "--new-keys-per-second", "100", "--response-bytes", "4096", "-config", "config.example.yaml"}, &out, &errb)
	if err != nil {
		t.Fatal(err, errb.String())
	}
	if !strings.Contains(out.String(), "| 100 | 24h | 4 KiB |") {
		t.Errorf("size with config.example.yaml:\n%s", out.String())
	}
}

// TestSizePostgres (issue 56): idemproxy size --store postgres prints the
// PostgreSQL store's records, disk and WAL from the units bench pgunits
// measured; a config on store.postgres selects it.
func TestSizePostgres(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"size", "--store", "postgres", "--new-keys-per-second", "1000", "--retention", "168h"}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	for _, want := range []string{"records held: 604800000", "disk (table, indexes, TOAST): 984.0 GiB, at 1747 bytes per record",
		"WAL: 11.6 MiB/s, at 12120 bytes per key (claim, completion, expiry; pages logged whole at their first change after each checkpoint, every 5m0s: 8205 bytes of the key's index at the claim, 1284 of the table at the expiry",
		"WAL with wal_compression = zstd (index pages 0.41× as large): 6.9 MiB/s", "writes: 2000 transactions/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("size --store postgres printed:\n%s\nwant %q", out.String(), want)
		}
	}
	// The images' model against what bench pgunits -existing measured:
	// 5,000 claims after a checkpoint over 500,000 and 2,000,000 records,
	// 1.02 and 1.22 images per claim.
	for _, m := range []struct{ records, images float64 }{{500_000, 1.02}, {2_000_000, 1.22}} {
		if got := pgImagesPerClaim(m.records, 5000); math.Abs(got-m.images) > 0.05*m.images {
			t.Errorf("images per claim over %.0f records = %.2f, measured %.2f", m.records, got, m.images)
		}
	}
	// A small index is logged whole once per checkpoint, less often
	// with a longer interval; records kept for less than one interval
	// expire on pages already logged; a non-positive interval is refused.
	out.Reset()
	if err := run(context.Background(), []string{"size", "--store", "postgres", "--new-keys-per-second", "1000", "--retention", "24h", "--response-bytes", "200"}, &out, &errb); err != nil ||
		!strings.Contains(out.String(), "7458 bytes of the key's index at the claim, 678 of the table at the expiry") {
		t.Errorf("size with 200-byte answers: %v\n%s\nwant the expiry's page share of a smaller record", err, out.String())
	}
	for _, c := range []struct{ retention, interval, want string }{
		{"1h", "30m", "at 4169 bytes per key (claim, completion, expiry; pages logged whole at their first change after each checkpoint, every 30m0s: 254 bytes of the key's index at the claim, 1284 of the table at the expiry"},
		{"10m", "30m", "at 2673 bytes per key (claim, completion, expiry; pages logged whole at their first change after each checkpoint, every 30m0s: 42 bytes of the key's index at the claim, 0 of the table at the expiry"},
	} {
		out.Reset()
		if err := run(context.Background(), []string{"size", "--store", "postgres", "--new-keys-per-second", "10", "--retention", c.retention, "--checkpoint-interval", c.interval}, &out, &errb); err != nil || !strings.Contains(out.String(), c.want) {
			t.Errorf("size --retention %s --checkpoint-interval %s: %v\n%s\nwant %q", c.retention, c.interval, err, out.String(), c.want)
		}
	}
	if err := run(context.Background(), []string{"size", "--store", "postgres", "--new-keys-per-second", "10", "--checkpoint-interval", "0s"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "--checkpoint-interval") {
		t.Errorf("--checkpoint-interval 0s: %v, want refused naming the flag", err)
	}
	path := t.TempDir() + "/pg.yaml"
	if err := os.WriteFile(path, []byte("upstream:\n  url: \"http://127.0.0.1:9\"\nstore:\n  postgres:\n    url: \"postgres://u@db/app\"\nroutes:\n  - name: pay\n    match: \"POST /p\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"size", "-config", path, "--new-keys-per-second", "10"}, &out, &errb); err != nil || !strings.HasPrefix(out.String(), "PostgreSQL store:") {
		t.Errorf("size -config on store.postgres: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"size", "--store", "mysql", "--new-keys-per-second", "10"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "--store") {
		t.Errorf("--store mysql: %v, want refused naming the flag", err)
	}
}
