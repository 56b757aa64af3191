package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestVersionMatchesChangelog: the version -version prints is the one
// CHANGELOG.md is at (a released heading, or the Unreleased section's
// "toward vX" while it ends in -dev), and PREVIOUS_RELEASE names a released
// version of the changelog with its commit.
func TestVersionMatchesChangelog(t *testing.T) {
	b, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	headings := regexp.MustCompile(`(?m)^## \[([^\]]+)\](.*)$`).FindAllStringSubmatch(text, -1)
	if len(headings) < 2 {
		t.Fatalf("CHANGELOG.md has %d version headings", len(headings))
	}
	if base, dev := strings.CutSuffix(version, "-dev"); dev {
		if headings[0][1] != "Unreleased" {
			t.Fatalf("version %s is in progress, but CHANGELOG.md's first heading is %q, not Unreleased", version, headings[0][1])
		}
		section := text[strings.Index(text, "## [Unreleased]"):]
		section = section[:strings.Index(section[3:], "\n## ")+3]
		if !strings.Contains(section, "toward "+base) {
			t.Errorf("CHANGELOG.md's Unreleased section does not say it is the work toward %s", base)
		}
	} else if headings[0][1] != version {
		t.Errorf("-version says %s, CHANGELOG.md's latest release is %s", version, headings[0][1])
	}
	prev, err := os.ReadFile("PREVIOUS_RELEASE")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(prev))
	if len(f) != 2 || len(f[1]) != 40 {
		t.Fatalf("PREVIOUS_RELEASE = %q, want \"<version> <40-hex commit>\"", prev)
	}
	found := false
	for _, h := range headings {
		if h[1] == f[0] && strings.Contains(h[2], f[1][:7]) {
			found = true
		}
	}
	if !found {
		t.Errorf("PREVIOUS_RELEASE names %s at %s; CHANGELOG.md has no heading [%s] ... (%s)", f[0], f[1][:7], f[0], f[1][:7])
	}
	if !strings.Contains(text, "### Upgrading from "+f[0]) {
		t.Errorf("CHANGELOG.md has no \"Upgrading from %s\" notes", f[0])
	}
}
