package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad: any file gives a config or a list of problems, never a panic,
// and a config Load accepts is one Validate accepts.
func FuzzLoad(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, file := range append(files, "../config.example.yaml") {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("routes: [1, 2]\ndefaults: 3\n"))
	f.Add([]byte("routes:\n  - name: a\n    match: \"POST /{x}/{x}\"\n"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load accepted a config Validate rejects: %v", err)
		}
	})
}
