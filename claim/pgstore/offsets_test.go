package pgstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim/contract"
)

// TestSchemaNamesTheRecordsFields (issue 77): schema.sql and the SQL
// built in Go spell out no offset of a stored value (each names its
// field, rendered from claim.Fields), and every offset they read once
// rendered falls on a field of claim.Fields.
func TestSchemaNamesTheRecordsFields(t *testing.T) {
	if n := contract.CheckNoOffsets(t, "schema.sql", schemaSource); n < 40 {
		t.Errorf("schema.sql names %d fields: the placeholders no longer match its text", n)
	}
	if n := contract.CheckOffsets(t, "schema.sql, rendered", schemaSQL); n < 40 {
		t.Errorf("checked %d offsets in the rendered schema.sql: the forms no longer match its text", n)
	}
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) < 9 {
		t.Fatalf("the package's Go files: %v, %v", files, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		contract.CheckNoOffsets(t, f, string(src))
	}
	if n := contract.CheckOffsets(t, "replayFirst's state test", "pg_catalog.substring(r.value, "+settledTest); n != 1 {
		t.Errorf("checked %d offsets in replayFirst's state test, want 1", n)
	}
}
