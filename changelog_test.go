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

// TestReleasesNameTheirCommits (issue 57): an operator finds any
// release's commit from CHANGELOG.md, without tags (they do not travel
// with main): every version heading but Unreleased is "[vX.Y.Z] — date
// (commit)", and where this clone has the whole history (not shallow; CI
// sets IDEMPROXY_REQUIRE_PREVIOUS=1) each commit is one of main's.
func TestReleasesNameTheirCommits(t *testing.T) {
	b, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := regexp.MustCompile(`(?m)^## .*$`).FindAllString(string(b), -1)
	// A shallow clone lacks old commits by design: their presence is
	// required only of a full history.
	shallow := true
	if out, err := exec.Command("git", "rev-parse", "--is-shallow-repository").Output(); err == nil {
		shallow = strings.TrimSpace(string(out)) != "false"
	}
	form := regexp.MustCompile(`^## \[(v\d+\.\d+\.\d+)\] — \d{4}-\d{2}-\d{2} \(([0-9a-f]{7,40})\)$`)
	releases := 0
	for _, h := range headings {
		if h == "## [Unreleased]" || h == "## Compatibility rule (rolling upgrades)" {
			continue
		}
		m := form.FindStringSubmatch(h)
		if m == nil {
			t.Errorf("CHANGELOG.md heading %q: want \"## [vX.Y.Z] — YYYY-MM-DD (commit)\"", h)
			continue
		}
		releases++
		if _, err := exec.LookPath("git"); err != nil {
			continue
		}
		commit := m[2]
		if err := exec.Command("git", "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
			if os.Getenv("IDEMPROXY_REQUIRE_PREVIOUS") == "1" && !shallow {
				t.Errorf("release %s names commit %s, which this clone's history does not have", m[1], commit)
			} else {
				t.Logf("release %s: commit %s is not in this clone (shallow?); set IDEMPROXY_REQUIRE_PREVIOUS=1 to require it", m[1], commit)
			}
			continue
		}
		if err := exec.Command("git", "merge-base", "--is-ancestor", commit, "HEAD").Run(); err != nil {
			t.Errorf("release %s names commit %s, which is not on this branch's history", m[1], commit)
		}
	}
	if releases < 6 {
		t.Errorf("CHANGELOG.md names %d releases, want v0.1.0 to v0.6.0 at least", releases)
	}
}
