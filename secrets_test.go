package main

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestPasswordFile: the Redis password comes from a mounted file; with the
// right one the store is up, with a wrong one idemproxy_store_up says so.
func TestPasswordFile(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	for _, tc := range []struct {
		password string
		up       bool
	}{{"s3cret\n", true}, {"wrong", false}} {
		file := filepath.Join(t.TempDir(), "password")
		os.WriteFile(file, []byte(tc.password), 0o600)
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Store.Redis = config.Redis{Addrs: []string{srv.Addr}, PasswordFile: file}
		if got := storeUpOnce(t, cfg); got != tc.up {
			t.Errorf("password %q: store up %t, want %t", tc.password, got, tc.up)
		}
	}
}

// TestSentinelPasswordFile: sentinels with their own password, read from a
// mounted file; with the right one the store is up, with a wrong one
// idemproxy_store_up says so.
func TestSentinelPasswordFile(t *testing.T) {
	topo := redistest.StartSentinelAuth(t, 1, "data-pw", "sentinel-pw")
	for _, tc := range []struct {
		password string
		up       bool
	}{{"sentinel-pw\n", true}, {"wrong", false}} {
		file := filepath.Join(t.TempDir(), "sentinel-password")
		os.WriteFile(file, []byte(tc.password), 0o600)
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Store.Redis = config.Redis{Addrs: topo.SentinelAddrs(), MasterName: topo.MasterName, Password: "data-pw", SentinelPasswordFile: file}
		if got := storeUpOnce(t, cfg); got != tc.up {
			t.Errorf("sentinel password %q: store up %t, want %t", tc.password, got, tc.up)
		}
	}
}

// storeUpOnce serves cfg until the store watcher has looked at Redis once,
// stops and returns whether it found it up (idemproxy_store_up). /readyz
// answers 200 either way: readiness is the sidecar's own.
func storeUpOnce(t *testing.T, cfg *config.Config) bool {
	t.Helper()
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	var up bool
	poll.Until(t, "the store watcher's first look", func() bool {
		var seen bool
		seen, up = storeUp(t, "http://"+s.adminAddr)
		return seen
	})
	resp, err := http.Get("http://" + s.adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz %d with the store up=%t, want 200: readiness is not tied to the store", resp.StatusCode, up)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return up
}

// TestSealingOptions: key files are base64 of 32 bytes; a bad one is
// refused at start, named by its key.
func TestSealingOptions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o400)
		return p
	}
	good := write("good", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n") // 32 bytes
	short := write("short", "c2hvcnQ=")
	notB64 := write("bad", "not base64!")
	for _, tc := range []struct {
		files []string
		want  string
	}{
		{[]string{good}, ""},
		{[]string{good, short}, "store.encryption.key_files[1]"},
		{[]string{notB64}, "store.encryption.key_files[0]"},
		{[]string{filepath.Join(dir, "missing")}, "store.encryption.key_files[0]"},
	} {
		var st config.Store
		st.Encryption.KeyFiles = tc.files
		opts, _, err := sealingOptions(st)
		switch {
		case tc.want == "" && (err != nil || len(opts) != 1):
			t.Errorf("%v: %v, %d options; want one", tc.files, err, len(opts))
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error naming %s", tc.files, err, tc.want)
		}
	}
}

// TestExposedSecretFiles (issue 31): a secret file readable by every user,
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
		return exposedSecrets(cfg, func() ([]int, error) { return groups, nil })
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
