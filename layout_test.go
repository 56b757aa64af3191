package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestArchitectureLayoutNamesEveryFile: docs/architecture.md's Layout
// names every product file (productDirs: what the binary ships) by its
// whole path, and its directory, so that a file added without a word
// about it fails here.
func TestArchitectureLayoutNamesEveryFile(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "## Layout")
	if start < 0 {
		t.Fatal("docs/architecture.md has no Layout section")
	}
	layout := text[start:]
	if end := strings.Index(layout[len("## Layout"):], "\n## "); end >= 0 {
		layout = layout[:len("## Layout")+end]
	}
	for _, dir := range productDirs {
		if dir != "." && !strings.Contains(layout, "`"+dir+"/`") && !strings.Contains(layout, "`"+dir+"`") {
			t.Errorf("the Layout does not name %s/", dir)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			// By whole path: store.go is a file of four directories.
			if !strings.Contains(layout, "`"+filepath.ToSlash(f)+"`") {
				t.Errorf("the Layout does not name %s, by its whole path", f)
			}
		}
	}
}
