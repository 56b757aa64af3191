package fleet

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// v070 is the release before record_format 5 (CHANGELOG.md): it reads a
// stream's value alone, knowing no chunk rows.
var v070 = binarytest.Release{Version: "v0.7.0", Commit: "0e477fad3c22d58d1d34a80c70e271659de45b4c"}

// TestFormat5StreamRefusedByV070 (issue 78): a stream this tree stored
// under record_format 5 (its chunks as rows) is refused by v0.7.0, 500
// record-unreadable, after a rollback; it is never replayed short. This
// tree and the previous release (which knows chunk rows) replay it whole,
// and the upstream ran once. Before the
// head's last byte went into a chunk row, v0.7.0 replayed it as a
// complete 200 with an empty body (tried).
func TestFormat5StreamRefusedByV070(t *testing.T) {
	mayBuild(t)
	previous := binarytest.PreviousT(t)
	prevBin, err := previous.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := v070
	r.Top = previous.Top
	oldBin, err := r.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pg := pgtest.Start(t)
	var calls atomic.Int64
	const events = "data: one\n\ndata: two\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, ev := range strings.SplitAfter(events, "\n\n") {
			io.WriteString(w, ev)
			http.NewResponseController(w).Flush()
		}
	}))
	defer up.Close()
	config := func(format int) string {
		return fmt.Sprintf("upstream:\n  url: %q\nstore:\n  postgres:\n    url: %q\n  record_format: %d\nroutes:\n  - name: pay\n    match: \"POST /payments\"\n", up.URL, pg.URL, format)
	}
	cur := start(t, "this tree, record_format 5", binarytest.TestBinary(t), config(5))
	if a := cur.pay(t, "rolled-back", `{"n":1}`); a.status != http.StatusOK || a.body != events {
		t.Fatalf("first attempt: %d %q", a.status, a.body)
	}
	old := start(t, "v0.7.0, record_format 4", oldBin, config(4))
	a := old.pay(t, "rolled-back", `{"n":1}`)
	t.Logf("v0.7.0's retry: %d %q", a.status, a.body)
	if a.status != http.StatusInternalServerError || !strings.Contains(a.body, "record-unreadable") {
		t.Errorf("v0.7.0's retry of a record_format 5 stream: %d %q; want 500 record-unreadable, never the stream replayed short", a.status, a.body)
	}
	if a := cur.pay(t, "rolled-back", `{"n":1}`); a.status != http.StatusOK || a.body != events || !a.replayed {
		t.Errorf("this tree's retry: %+v; want the whole stream replayed", a)
	}
	prev := start(t, previous.Version+", record_format 5", prevBin, config(5))
	if a := prev.pay(t, "rolled-back", `{"n":1}`); a.status != http.StatusOK || a.body != events || !a.replayed {
		t.Errorf("%s's retry: %+v; want the whole stream replayed", previous.Version, a)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want 1", n)
	}
}
