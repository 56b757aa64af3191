package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
)

// TestExposedSecretFiles (issue 31; world-readable password files warned before): a secret file readable by every user,
// or by a group this process is not in, gets a warning naming the key and
// the fix; one readable only by its owner, or by a group the process is in
// (a Kubernetes Secret with defaultMode 0440 and the pod's fsGroup), does
// not; a symlink is judged by its file (Secret mounts are symlinks).
func TestExposedSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("0123456789abcdef-admin\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	world, owner, group := write("world", 0o644), write("owner", 0o400), write("group", 0o440)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(world, link); err != nil {
		t.Fatal(err)
	}
	warn := func(path string, groups []int) []string {
		cfg := config.Default()
		cfg.Admin.TokenFile = path
		return config.ExposedSecrets(cfg, func() ([]int, error) { return groups, nil })
	}
	if w := warn(world, nil); len(w) != 1 || !strings.Contains(w[0], "admin.token_file") || !strings.Contains(w[0], "every user") {
		t.Errorf("a world-readable token file: %q, want one warning naming admin.token_file", w)
	}
	if w := warn(link, nil); len(w) != 1 {
		t.Errorf("a symlink to a world-readable file: %q, want the warning", w)
	}
	if w := warn(owner, nil); len(w) != 0 {
		t.Errorf("an owner-only file: %q, want none", w)
	}
	if w := warn(group, []int{os.Getgid()}); len(w) != 0 {
		t.Errorf("a file readable by this process' group: %q, want none", w)
	}
	// A group this process is not in: only root may give a file one.
	foreign := write("foreign", 0o440)
	if err := os.Chown(foreign, -1, 54321); err != nil {
		t.Logf("a file of a foreign group needs root (%v): that case is not run", err)
		return
	}
	if w := warn(foreign, []int{os.Getgid()}); len(w) != 1 || !strings.Contains(w[0], "group 54321") {
		t.Errorf("a file readable by a group this process is not in: %q, want a warning naming the group", w)
	}
}
