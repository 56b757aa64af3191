package pgstore

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/binarytest"
)

// TestSchemaVersionRule (issue 77): a rollout runs the previous release
// and this one side by side on one schema, each calling the functions of
// its own schema version, and a restarted pod of either reinstalls its
// own (CREATE OR REPLACE). So two releases with one schema version must
// install the same functions, body for body: a function changed without
// a new SchemaVersion would be put back by the other release's pods
// mid-rollout. Checked against the previous release's schema.sql, from
// this clone's history.
func TestSchemaVersionRule(t *testing.T) {
	r := binarytest.PreviousT(t)
	dir := t.TempDir()
	if err := r.Extract(dir, "claim/pgstore/schema.sql", "claim/pgstore/store.go"); err != nil {
		t.Fatalf("extract %s's schema: %v", r.Version, err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, "claim/pgstore", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	m := regexp.MustCompile(`const SchemaVersion = (\d+)`).FindStringSubmatch(read("store.go"))
	if m == nil {
		t.Fatalf("%s's store.go declares no SchemaVersion", r.Version)
	}
	previous, _ := strconv.Atoi(m[1])
	switch {
	case previous > SchemaVersion:
		t.Fatalf("SchemaVersion %d is below %s's %d", SchemaVersion, r.Version, previous)
	case previous < SchemaVersion:
		t.Logf("SchemaVersion %d, %s's %d: this release installs functions of its own", SchemaVersion, r.Version, previous)
		return
	}
	theirs, ours := functionBodies(t, claim.SQLLayout(read("schema.sql"))), functionBodies(t, schemaSQL)
	for name, body := range ours {
		switch old, ok := theirs[name]; {
		case !ok:
			t.Errorf("function %s is new, under %s's schema version %d: give the schema a new SchemaVersion", name, r.Version, SchemaVersion)
		case old != body:
			t.Errorf("function %s differs from %s's, under the same schema version %d: give the schema a new SchemaVersion", name, r.Version, SchemaVersion)
		}
	}
	for name := range theirs {
		if _, ok := ours[name]; !ok {
			t.Errorf("function %s of %s's schema version %d is gone, under the same version: give the schema a new SchemaVersion", name, r.Version, SchemaVersion)
		}
	}
}

// functionBodies are the functions sql creates, by name, each its whole
// statement with the schema and release left as placeholders.
func functionBodies(t *testing.T, sql string) map[string]string {
	t.Helper()
	start := regexp.MustCompile(`(?m)^CREATE OR REPLACE FUNCTION \{\{schema\}\}\.(\w+)\(`)
	out := map[string]string{}
	locs := start.FindAllStringSubmatchIndex(sql, -1)
	for i, loc := range locs {
		end := len(sql)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		body := sql[loc[0]:end]
		// The statement ends at its last $$ and what follows it on that line.
		if j := strings.LastIndex(body, "$$"); j >= 0 {
			if k := strings.IndexByte(body[j:], '\n'); k >= 0 {
				body = body[:j+k]
			}
		}
		out[sql[loc[2]:loc[3]]] = body
	}
	if len(out) < 20 {
		t.Fatalf("found %d functions in a schema.sql: the pattern no longer matches its text", len(out))
	}
	return out
}

// TestNoAdvisoryLocks (issue 78, item 2): nothing idemproxy sends to
// PostgreSQL takes an advisory lock, which any role that can connect may
// take first (and so stop the store: every first-sent claim and store
// migrate waited on one under v0.8.0). It locks rows and tables of its
// own schema, which privileges protect.
func TestNoAdvisoryLocks(t *testing.T) {
	advisory := regexp.MustCompile(`pg_(try_)?advisory`)
	sources := map[string]string{"schema.sql": schemaSQL}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources[f] = string(b)
	}
	for name, text := range sources {
		if loc := advisory.FindStringIndex(text); loc != nil {
			t.Errorf("%s takes an advisory lock: %q", name, text[loc[0]:min(loc[1]+40, len(text))])
		}
	}
}
