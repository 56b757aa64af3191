package config_test

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// recommended are the keys config.example.yaml sets to something other
// than the binary's default, on purpose; each such line says
// "recommended" and why.
var recommended = []string{
	"store.redis.addrs",       // a real Redis: the default, the embedded store, is for development only
	"defaults.quota.new_keys", // a sized quota (docs/scaling.md#sizing); the default is off
}

// TestExampleShowsTheDefaults (issue 31): config.example.yaml opens with
// "Every key is shown with its default unless noted". Every key outside
// routes is in it, and loaded it equals the built-in defaults except for
// the recommended keys, whose lines say so. Before, it showed
// quota.new_keys: 1000 as if it were the default (0), and an explicit
// store.encryption.required: false, which would have turned off the
// sealing a user turns on by adding key files.
func TestExampleShowsTheDefaults(t *testing.T) {
	const file = "../config.example.yaml"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	c, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	got, want := config.Leaves(c), config.Leaves(config.Default())
	var differ []string
	for path, w := range want {
		if !reflect.DeepEqual(got[path], w) {
			differ = append(differ, path)
		}
		last := path[strings.LastIndex(path, ".")+1:]
		if !strings.Contains(text, last+":") {
			t.Errorf("%s is not shown in %s", path, file)
		}
	}
	slices.Sort(differ)
	wantDiffer := slices.Sorted(slices.Values(recommended))
	if !slices.Equal(differ, wantDiffer) {
		t.Errorf("keys %s sets apart from the defaults: %v, want exactly the recommended ones %v", file, differ, wantDiffer)
	}
	// A key whose default follows another is never written out: an
	// explicit store.encryption.required: false would keep sealing off
	// for a user who adds key files.
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "required:") {
			t.Errorf("%s sets store.encryption.required (%q): its default is true once key_files are set", file, strings.TrimSpace(line))
		}
	}
	for _, path := range recommended {
		last := path[strings.LastIndex(path, ".")+1:]
		found := false
		for line := range strings.SplitSeq(text, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), last+":") && strings.Contains(line, "recommended") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: the line setting %s does not say it is recommended (not the default)", file, path)
		}
	}
}
