package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestStoreCopyCarriesOrphans (issue 62): a switch of stores as
// docs/production.md describes it executes nothing twice. A sidecar on
// Redis killed while its upstream call ran leaves a claim: while its lease
// runs, idemproxy store copy refuses (exit 1, naming the key) and writes
// nothing; with -wait it waits for the lease to lapse and carries the
// orphan; the retry on the PostgreSQL store gets 502 outcome-unknown, as it
// would have on Redis, and the upstream executed once. A copy between
// configs that derive different keys (another key secret) is refused
// before it writes anything.
func TestStoreCopyCarriesOrphans(t *testing.T) {
	t.Parallel()
	rdb := redistest.Start(t)
	pg := pgtest.Start(t)
	var calls atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		calls.Add(1) // acted; its answer never comes back
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	defer upstream.Close()
	dir := t.TempDir()
	write := func(name, body string) string { return writeIn(t, dir, name, body) }
	defaults := "defaults:\n  lease: 2s\n  unknown_outcome: fail\n"
	oldCfg := write("redis.yaml", payConfig(upstream.URL, rdb.Addr, defaults))
	newCfg := write("postgres.yaml", pgConfig(upstream.URL, pg.URL, defaults))
	bin := binarytest.TestBinary(t)
	storeCopy := func(args ...string) (string, int) {
		cmd := exec.Command(bin, append([]string{"store", "copy", "-from-redis", oldCfg}, args...)...)
		out, err := cmd.CombinedOutput()
		if _, exited := err.(*exec.ExitError); err != nil && !exited {
			t.Fatal(err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}

	old := startBinary(t, payConfig(upstream.URL, rdb.Addr, defaults))
	go func() {
		if resp, err := http.DefaultClient.Do(payRequest(old.Client+"/payments", "switched-1", "{}")); err == nil {
			resp.Body.Close()
		}
	}()
	poll.Until(t, "the request reaches the upstream", func() bool { return calls.Load() > 0 })

	// The owner lives and renews: the drain is not over.
	out, code := storeCopy("-config", newCfg)
	if code != 1 || !strings.Contains(out, "1 keys (idem:") || !strings.Contains(out, "lease still runs") {
		t.Fatalf("store copy during a live claim: exit %d\n%s\nwant exit 1 naming the claim", code, out)
	}
	var rows int
	if err := pg.Conn(t).QueryRow(t.Context(), "select count(*) from idemproxy.records").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("after a refused copy PostgreSQL holds %d records (%v), want none", rows, err)
	}

	// Another key secret derives other keys: refused before any write.
	secret := write("secret", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==\n")
	other := write("other.yaml", pgConfig(upstream.URL, pg.URL, "  key_secret_file: "+secret+"\n"+defaults))
	if out, code := storeCopy("-config", other); code != 1 || !strings.Contains(out, "derive different keys") {
		t.Fatalf("store copy between configs with different key secrets: exit %d\n%s\nwant exit 1, refused", code, out)
	}

	old.Kill() // mid-request: its claim is an orphan once its lease lapses
	out, code = storeCopy("-config", newCfg, "-wait", "30s")
	if code != 0 || !strings.Contains(out, "1 orphaned claims") {
		t.Fatalf("store copy -wait after the owner died: exit %d\n%s\nwant the orphan carried", code, out)
	}

	sc := startBinary(t, pgConfig(upstream.URL, pg.URL, defaults))
	var status int
	var body string
	poll.Until(t, "the orphan is settled on PostgreSQL", func() bool {
		status, body = post(t, sc.Client+"/payments", "switched-1", "{}")
		return status != http.StatusConflict
	})
	if status != http.StatusBadGateway || !strings.Contains(body, "outcome-unknown") {
		t.Fatalf("retry on PostgreSQL after the switch: %d %s, want 502 outcome-unknown", status, body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the upstream executed %d times across the switch, want 1", n)
	}
}

// writeIn writes body to the file name in dir (0600) and returns its path.
func writeIn(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
