package binarytest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The previous release: the one PREVIOUS_RELEASE names ("<version>
// <commit>"), taken from this clone's history with git archive, so the
// checkout is untouched. chaos -mixed and fleet/ run its binary beside this
// tree's; deploy/k8s/validate upgrades from its chart.

// RequirePreviousEnv, when "1" (.ci/run sets it), makes a test fail
// instead of skip when the previous release is not in the clone.
const RequirePreviousEnv = "IDEMPROXY_REQUIRE_PREVIOUS"

// ErrNoPrevious is returned when the previous release's commit is not in
// this clone (a shallow clone): git fetch --unshallow.
var ErrNoPrevious = errors.New("the previous release is not in this clone (shallow?): git fetch --unshallow")

// Release is a release PREVIOUS_RELEASE names, in the checkout at Top.
type Release struct {
	Version, Commit, Top string
}

// Previous reads PREVIOUS_RELEASE at the top of the git checkout the
// process runs in; ErrNoPrevious (wrapped) when its commit is missing.
func Previous() (Release, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return Release{}, fmt.Errorf("not in a git checkout: %w", err)
	}
	top := strings.TrimSpace(string(out))
	b, err := os.ReadFile(filepath.Join(top, "PREVIOUS_RELEASE"))
	if err != nil {
		return Release{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return Release{}, fmt.Errorf("PREVIOUS_RELEASE holds %q, want \"<version> <commit>\"", b)
	}
	r := Release{Version: f[0], Commit: f[1], Top: top}
	if err := exec.Command("git", "-C", top, "cat-file", "-e", r.Commit+"^{commit}").Run(); err != nil {
		return r, fmt.Errorf("%s (%s): %w", r.Version, r.Commit, ErrNoPrevious)
	}
	return r, nil
}

// Extract writes the release's tree, or only paths of it, into dir.
func (r Release) Extract(dir string, paths ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := append([]string{"sh", r.Top, r.Commit, dir}, paths...)
	extract := exec.Command("sh", append([]string{"-c", `top=$1 commit=$2 dir=$3; shift 3; git -C "$top" archive --format=tar "$commit" "$@" | tar -x -C "$dir"`}, args...)...)
	if out, err := extract.CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s (%s): %v\n%s", r.Version, r.Commit, err, out)
	}
	return nil
}

// Build builds the release's binary into dir and returns its path.
func (r Release) Build(dir string) (string, error) {
	src := filepath.Join(dir, "previous")
	if err := r.Extract(src); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "idemproxy-"+r.Version)
	return bin, Build(src, ".", bin)
}
