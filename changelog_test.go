package main

import (
	"os"
	"os/exec"
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

// TestReleaseTags (issue 46): each release CHANGELOG.md names with its
// commit, from v0.4.0 on, has a tag of its name on that commit. A clone
// fetched without tags (git clone --no-tags, a shallow CI checkout) has
// none to check: the test says so and checks nothing.
func TestReleaseTags(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not in PATH: no tags to check")
	}
	out, err := exec.Command("git", "tag", "-l", "v*").Output()
	if err != nil || len(strings.TrimSpace(string(out))) == 0 {
		t.Skip("this clone has no release tags (fetched without them): nothing to check")
	}
	b, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	releases := regexp.MustCompile(`(?m)^## \[(v\d+\.\d+\.\d+)\] — \S+ \(([0-9a-f]{7,40})\)`).FindAllStringSubmatch(string(b), -1)
	checked := 0
	for _, r := range releases {
		name, commit := r[1], r[2]
		if name < "v0.4.0" && len(name) == len("v0.4.0") {
			continue // tagged from v0.4.0 on
		}
		got, err := exec.Command("git", "rev-list", "-n", "1", name).Output()
		if err != nil {
			t.Errorf("release %s (CHANGELOG.md, %s) has no tag: git tag -a %s %s", name, commit, name, commit)
			continue
		}
		if !strings.HasPrefix(strings.TrimSpace(string(got)), commit) {
			t.Errorf("tag %s is on %s, CHANGELOG.md says %s", name, strings.TrimSpace(string(got)), commit)
		}
		checked++
	}
	if checked < 2 {
		t.Errorf("checked %d release tags, want v0.4.0 and v0.5.0 at least", checked)
	}
}
