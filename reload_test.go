package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
)

const reloadBase = `listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
upstream:
  url: %q
routes:
  - name: r
    match: %q
`

// startFromFile serves the config at path and returns the client and admin
// base URLs.
func startFromFile(t *testing.T, path string) (client, admin string) {
	t.Helper()
	return startFromFileLogging(t, path, slog.New(slog.DiscardHandler))
}

func startFromFileLogging(t *testing.T, path string, logger *slog.Logger) (client, admin string) {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := startTest(t, cfg, path, logger)
	return "http://" + s.clientAddr, "http://" + s.adminAddr
}

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// scrape returns admin's /metrics.
var scrape = binarytest.Scrape

func metric(t *testing.T, admin, line string) bool {
	t.Helper()
	return strings.Contains(scrape(t, admin), line)
}

// TestReloadFollowsAConfigMapUpdate lays the file out as a Kubernetes
// ConfigMap volume does (config.yaml -> ..data/config.yaml, ..data -> a
// timestamped directory) and updates it by swapping the ..data symlink.
func TestReloadFollowsAConfigMapUpdate(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	dir := t.TempDir()
	version := 0
	publish := func(content string) {
		version++
		v := filepath.Join(dir, fmt.Sprintf("..v%d", version))
		os.Mkdir(v, 0o755)
		if err := os.WriteFile(filepath.Join(v, "config.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		os.Symlink(filepath.Base(v), tmp)
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish(fmt.Sprintf(reloadBase, upstream.URL, "POST /a"))
	path := filepath.Join(dir, "config.yaml")
	if err := os.Symlink("..data/config.yaml", path); err != nil {
		t.Fatal(err)
	}
	client, admin := startFromFile(t, path)
	if got := status(t, client+"/a"); got != http.StatusUnauthorized {
		t.Fatalf("/a before reload: %d, want it protected (401 without identity)", got)
	}

	publish(fmt.Sprintf(reloadBase, upstream.URL, "POST /b"))
	poll.Until(t, "the new routes serve", func() bool { return status(t, client+"/b") == http.StatusUnauthorized })
	if got := status(t, client+"/a"); got != http.StatusCreated {
		t.Fatalf("/a after reload: %d, want it passed through", got)
	}
	if !metric(t, admin, `idemproxy_config_reloads_total{result="ok"} 1`) {
		t.Error("successful reload not counted")
	}

	publish(fmt.Sprintf(reloadBase, upstream.URL, "POST /b") + "    lease: banana\n")
	poll.Until(t, "the bad file is rejected", func() bool {
		return metric(t, admin, `idemproxy_config_reloads_total{result="error"} 1`)
	})
	if !metric(t, admin, "idemproxy_config_last_reload_successful 0") {
		t.Error("rejected reload not reported by the gauge")
	}
	if got := status(t, client+"/b"); got != http.StatusUnauthorized {
		t.Fatalf("/b after a rejected reload: %d, want the old config still serving", got)
	}
}

func TestReloadOnSIGHUP(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadBase, upstream.URL, "POST /a")), 0o644); err != nil {
		t.Fatal(err)
	}
	client, admin := startFromFile(t, path)
	if got := status(t, client+"/a"); got != http.StatusUnauthorized {
		t.Fatalf("/a: %d", got)
	}
	// The watcher would also notice this write; SIGHUP forces the reload
	// even if it already did, so the count is at least 1 either way.
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadBase, upstream.URL, "POST /c")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "SIGHUP reloads", func() bool { return status(t, client+"/c") == http.StatusUnauthorized })
	if metric(t, admin, `idemproxy_config_reloads_total{result="ok"} 0`) {
		t.Error("reload not counted")
	}
}

// TestDrainDelayFailsReadinessFirst: during drain.delay /readyz fails while
// the client port still serves.
func TestDrainDelayFailsReadinessFirst(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Upstream.URL = upstream.URL
	cfg.Drain.Delay = 700 * time.Millisecond
	s, stop := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	client, admin := "http://"+s.clientAddr, "http://"+s.adminAddr
	ready := func() int {
		resp, err := http.Get(admin + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := ready(); got != http.StatusOK {
		t.Fatalf("/readyz before drain: %d", got)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }() // SIGTERM
	poll.Until(t, "/readyz fails", func() bool { return ready() == http.StatusServiceUnavailable })
	// Still within the delay: the client port keeps serving.
	if got := status(t, client+"/anything"); got != http.StatusCreated {
		t.Fatalf("client port during drain delay: %d, want still served", got)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestLogLevelReloads: log_level warn drops the per-request lines, and a
// reload back to info brings them back, without a restart.
func TestLogLevelReloads(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(level string) {
		content := "log_level: " + level + "\n" + fmt.Sprintf(reloadBase, upstream.URL, "POST /a")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("warn")
	var logs syncbuf.Buffer
	client, admin := startFromFileLogging(t, path, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	keyed := func(key string) {
		t.Helper()
		resp, err := http.DefaultClient.Do(binarytest.PayRequest(client+"/a", key, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	requestLines := func() int { return strings.Count(logs.String(), `"msg":"request"`) }
	keyed("k1")
	if n := requestLines(); n != 0 {
		t.Fatalf("%d per-request lines at log_level warn, want 0:\n%s", n, logs.String())
	}
	write("info")
	poll.Until(t, "the reload", func() bool { return metric(t, admin, `idemproxy_config_reloads_total{result="ok"} 1`) })
	keyed("k2")
	poll.Until(t, "a per-request line at log_level info", func() bool { return requestLines() == 1 })
}

// TestKeysAPIFollowsReload: the key API finds routes as the proxy does, a
// route added by a reload included (it read the routes of the start).
func TestKeysAPIFollowsReload(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-admin"), 0o400); err != nil {
		t.Fatal(err)
	}
	conf := func(name string) []byte {
		return fmt.Appendf(nil, "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nadmin:\n  token_file: %q\nupstream:\n  url: \"http://127.0.0.1:9\"\nroutes:\n  - name: %s\n    match: \"POST /a\"\n", tokenFile, name)
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, conf("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, admin := startFromFile(t, path)
	lookup := func(route string) int {
		req, _ := http.NewRequest(http.MethodGet, admin+"/v1/keys?route="+route+"&principal=alice&key=k1", nil)
		req.Header.Set("Authorization", "Bearer 0123456789abcdef-admin")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := lookup("first"); got != http.StatusOK {
		t.Fatalf("route first before the reload: %d", got)
	}
	if err := os.WriteFile(path, conf("second"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the key API knows the reloaded route", func() bool { return lookup("second") == http.StatusOK })
	if got := lookup("first"); got != http.StatusBadRequest {
		t.Errorf("route first after it was removed: %d, want 400", got)
	}
}

// TestReloadSeesAChangeRightAfterStart: a change written as the process
// starts, before its file watch is in place, is still applied (it used to
// wait for the next change or a SIGHUP; CI hit it once under load).
func TestReloadSeesAChangeRightAfterStart(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadBase, upstream.URL, "POST /a")), 0o644); err != nil {
		t.Fatal(err)
	}
	client, _ := startFromFile(t, path)
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadBase, upstream.URL, "POST /b")), 0o644); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the change serves", func() bool { return status(t, client+"/b") == http.StatusUnauthorized })
}

// TestReloadRejectedThenReverted (issue 46): a rejected config is logged
// and counted once however often its directory changes, and reverting the
// file to the running config sets idemproxy_config_last_reload_successful
// back to 1 with one line saying so.
func TestReloadRejectedThenReverted(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	good := fmt.Sprintf(reloadBase, upstream.URL, "POST /a")
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	_, admin := startFromFileLogging(t, path, slog.New(slog.NewJSONHandler(logs, nil)))
	// Replaced whole, as a ConfigMap update does: a write in place can be
	// seen half done (empty) on a loaded machine, a second rejection of
	// another content.
	replace := func(content string) {
		t.Helper()
		tmp := filepath.Join(dir, ".config.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	replace(good + "bogus_key: 1\n")
	poll.Until(t, "the bad config is rejected", func() bool {
		return metric(t, admin, "idemproxy_config_last_reload_successful 0")
	})
	// Something else in the directory changes, again and again (a log
	// file beside the config).
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(dir, "sidecar.log"), []byte(strings.Repeat("x", i)), 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(reloadQuiet + 50*time.Millisecond)
	}
	if n := strings.Count(logs.String(), "config reload rejected"); n != 1 {
		t.Errorf("the same rejected config was logged %d times, want once:\n%s", n, logs.String())
	}
	if !metric(t, admin, `idemproxy_config_reloads_total{result="error"} 1`) {
		t.Errorf("rejections counted:\n%s", grepMetric(scrape(t, admin), "idemproxy_config_reloads_total"))
	}
	replace(good) // reverted: the running config
	poll.Until(t, "the gauge is back to 1", func() bool {
		return metric(t, admin, "idemproxy_config_last_reload_successful 1")
	})
	poll.Until(t, "the revert is logged", func() bool { return strings.Contains(logs.String(), "the running config again") })
	if n := strings.Count(logs.String(), "the running config again"); n != 1 {
		t.Errorf("the revert was logged %d times, want once:\n%s", n, logs.String())
	}
}

// grepMetric is the lines of text that contain name.
func grepMetric(text, name string) string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, name) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
