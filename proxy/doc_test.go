package proxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocNamesEveryFile (issue 77): the package's reading order (doc.go)
// names every file of the package, so that a file added without a place
// in it fails here.
func TestDocNamesEveryFile(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) < 40 {
		t.Fatalf("%d files, %v", len(files), err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") && !strings.Contains(string(doc), f) {
			t.Errorf("doc.go's reading order does not name %s", f)
		}
	}
}
