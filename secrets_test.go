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
		if err := os.WriteFile(file, []byte(tc.password), 0o600); err != nil {
			t.Fatal(err)
		}
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
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	topo := redistest.StartSentinelAuth(t, 1, "data-pw", "sentinel-pw")
	for _, tc := range []struct {
		password string
		up       bool
	}{{"sentinel-pw\n", true}, {"wrong", false}} {
		file := filepath.Join(t.TempDir(), "sentinel-password")
		if err := os.WriteFile(file, []byte(tc.password), 0o600); err != nil {
			t.Fatal(err)
		}
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
// follows: a sidecar whose store never worked since start is not ready
// (issue 79), whatever admin.readiness_requires_store says.
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
	if want := map[bool]int{true: http.StatusOK, false: http.StatusServiceUnavailable}[up]; resp.StatusCode != want {
		t.Errorf("/readyz %d with the store up=%t, want %d", resp.StatusCode, up, want)
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
		if err := os.WriteFile(p, []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
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
