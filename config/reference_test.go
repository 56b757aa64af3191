package config_test

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md's config reference from the declarations")

const (
	readme   = "../docs/configuration.md"
	refBegin = "<!-- reference: generated from the config declarations"
	refEnd   = "<!-- end reference -->"
)

// refRow is a row of the reference table: its key and, last, its meaning.
var refRow = regexp.MustCompile("^\\| `([^`]+)` \\|.* \\| (.*) \\|$")

// TestReadmeReference: docs/configuration.md's table of config keys is generated from
// the declarations (every key, its default, whether it reloads); only the
// meaning column is written by hand. A key added without a row, a renamed
// key or a changed default fails here; -update rewrites the table.
func TestReadmeReference(t *testing.T) {
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, refBegin)
	end := strings.Index(text, refEnd)
	if start < 0 || end < start {
		t.Fatalf("%s has no reference table between %q and %q", readme, refBegin, refEnd)
	}
	start += strings.Index(text[start:], "\n") + 1
	meaning := map[string]string{}
	for line := range strings.SplitSeq(text[start:end], "\n") {
		if m := refRow.FindStringSubmatch(line); m != nil {
			meaning[m[1]] = m[2]
		}
	}
	table, undocumented := config.Reference(meaning)
	if len(undocumented) > 0 {
		t.Errorf("keys without a meaning in docs/configuration.md's reference table (add a row, then run with -update): %s", strings.Join(undocumented, ", "))
	}
	if text[start:end] == table {
		return
	}
	if *update {
		if err := os.WriteFile(readme, []byte(text[:start]+table+text[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/configuration.md's config reference differs from the declarations; run go test ./config -run TestReadmeReference -update\n--- docs/configuration.md\n%s--- declared\n%s", text[start:end], table)
}

// TestRestartOnly names each changed key that needs a restart, and none of
// those that reload.
func TestRestartOnly(t *testing.T) {
	old, next := config.Default(), config.Default()
	next.Upstream.Timeout *= 2
	next.Store.Redis.Addrs = []string{"redis:6379"}
	next.LogLevel = "warn"
	next.Defaults.Lease *= 2
	got := config.RestartOnly(old, next)
	if strings.Join(got, " ") != "upstream.timeout store.redis.addrs" {
		t.Errorf("RestartOnly = %q, want upstream.timeout and store.redis.addrs", got)
	}
}
