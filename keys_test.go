package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/poll"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/syncbuf"
)

// TestKeysAPI: /v1/keys on the admin port needs the bearer token, looks a
// key up without its body unless asked, and deletes only in the state the
// caller names; the CLI reaches it too.
func TestKeysAPI(t *testing.T) {
	srv := redistest.Start(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	defer upstream.Close()
	cfg := lateConfig(srv, upstream.URL)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-admin\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	cfg.Admin.TokenFile = tokenFile
	logs := &syncbuf.Buffer{}
	s, _ := startTest(t, cfg, "", slog.New(slog.NewJSONHandler(logs, nil)))
	if status, _ := pay(t, s.clientAddr, "k1"); status != http.StatusCreated {
		t.Fatal(status)
	}
	call := func(method, query, token string) (int, string) {
		req, _ := http.NewRequest(method, "http://"+s.adminAddr+"/v1/keys?"+query, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const q = "route=pay&principal=alice&key=k1"
	for _, token := range []string{"", "wrong-token-wrong-token"} {
		if status, _ := call(http.MethodGet, q, token); status != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", token, status)
		}
	}
	if _, body := call(http.MethodGet, q, ""); !strings.Contains(body, "a bearer token is required") {
		t.Errorf("no token: %q, want it to say a token is required", body)
	}
	if _, body := call(http.MethodGet, q, "wrong-token-wrong-token"); !strings.Contains(body, "the bearer token was refused") {
		t.Errorf("a wrong token: %q, want it to say the token was refused", body)
	}
	const token = "0123456789abcdef-admin"
	if status, body := call(http.MethodGet, "route=paY&principal=alice&key=k1", token); status != http.StatusBadRequest || !strings.Contains(body, `route "paY" is not configured; the routes serving now: pay`) {
		t.Errorf("a misspelt route: %d %q, want 400 naming it and the routes", status, body)
	}
	if _, body := call(http.MethodGet, "route=pay", token); !strings.Contains(body, "principal, key required") {
		t.Errorf("no principal or key: %q, want both named", body)
	}
	var cliOut bytes.Buffer
	err := run(context.Background(), []string{"keys", "get", "-admin", "http://" + s.adminAddr, "-token-file", tokenFile,
		"-route", "paY", "-principal", "alice", "-key", "k1"}, &cliOut, io.Discard)
	if err == nil || !strings.Contains(cliOut.String(), `route "paY" is not configured`) {
		t.Errorf("idemproxy keys get -route paY: %v, printed %q; want an error naming the route", err, cliOut.String())
	}
	status, body := call(http.MethodGet, q, token)
	if !strings.Contains(body, `"store_key":"idem:`) || !strings.Contains(body, `"redis_key":"idem:`) {
		t.Errorf("the key API names the hashed key store_key (and redis_key for one release): %s", body)
	}
	if status != http.StatusOK || !strings.Contains(body, `"state":"completed"`) || !strings.Contains(body, `"status":201`) || strings.Contains(body, "charged") {
		t.Fatalf("GET: %d %s, want completed 201 without the body", status, body)
	}
	if _, body := call(http.MethodGet, q+"&body=true", token); !strings.Contains(body, `"body":"charged"`) {
		t.Errorf("GET with body=true: %s", body)
	}
	if status, _ := call(http.MethodDelete, q, token); status != http.StatusBadRequest {
		t.Errorf("DELETE without a state: %d, want 400", status)
	}
	if status, _ := call(http.MethodDelete, q+"&state=in_progress", token); status != http.StatusConflict {
		t.Errorf("DELETE state=in_progress of a completed key: %d, want 409 (left alone)", status)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "delete", "-admin", "http://" + s.adminAddr, "-token-file", tokenFile,
		"-route", "pay", "-principal", "alice", "-key", "k1", "-state", "completed"}, &out, io.Discard); err != nil {
		t.Fatalf("idemproxy keys delete: %v (%s)", err, out.String())
	}
	if _, body := call(http.MethodGet, q, token); !strings.Contains(body, `"state":"absent"`) {
		t.Errorf("GET after the delete: %s", body)
	}
	// A live in-progress claim is not released without force: a retry
	// would execute beside its owner.
	live := &claim.Record{State: claim.InProgress, Created: time.Now(), RequestID: "live"}
	liveKey := s.store.Codec().Key("alice", mustScope(t, s, "pay"), "k2")
	if res, err := s.store.Claim(context.Background(), liveKey, live, time.Minute, claim.Quota{}); err != nil || !res.Claimed {
		t.Fatalf("claim: %+v %v", res, err)
	}
	const q2 = "route=pay&principal=alice&key=k2"
	if status, body := call(http.MethodDelete, q2+"&state=in_progress", token); status != http.StatusConflict || !strings.Contains(body, "force=true") {
		t.Errorf("DELETE of a live claim: %d %s, want 409 naming force=true", status, body)
	}
	if status, _ := call(http.MethodDelete, q2+"&state=in_progress&force=true", token); status != http.StatusOK {
		t.Errorf("DELETE of a live claim with force=true: %d, want 200", status)
	}
	if !strings.Contains(logs.String(), `"principal_hash":"`) || !strings.Contains(logs.String(), `"body_read":true`) || !strings.Contains(logs.String(), `"force":true`) {
		t.Errorf("audit lines lack the hashed principal, whether the body was read or force:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), `"alice"`) {
		t.Errorf("an audit line carries the raw principal:\n%s", logs.String())
	}
	// The digest is keyed (issue 31): a reader of the audit log cannot
	// confirm a guessed principal by hashing it.
	plain := sha256.Sum256([]byte("alice"))
	if strings.Contains(logs.String(), hex.EncodeToString(plain[:8])) {
		t.Errorf("an audit line names alice by her plain SHA-256:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `"principal_hash":"`+principalDigest([]byte(token), "alice")+`"`) {
		t.Errorf("audit lines do not name alice by her keyed digest:\n%s", logs.String())
	}
	// /readyz?verbose names the masters (addresses, errors) only to a
	// caller with the admin token; anyone else who reaches the admin port
	// learns whether the store is up.
	time.Sleep(1100 * time.Millisecond) // the store watcher has looked
	readyz := func(token string) string {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.adminAddr+"/readyz?verbose", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if body := readyz(""); strings.Contains(body, srv.Addr) || !strings.Contains(body, "store: up=true") {
		t.Errorf("/readyz?verbose without the token: %q, want up=true and no Redis address", body)
	}
	if body := readyz(token); !strings.Contains(body, srv.Addr) {
		t.Errorf("/readyz?verbose with the token: %q, want the master's address", body)
	}
	if audit := strings.Count(logs.String(), `"msg":"admin key API"`); audit != 8 || strings.Count(logs.String(), "refused, bad or missing token") != 4 || strings.Contains(logs.String(), "k1\"") {
		t.Errorf("%d audit lines, want one per authorized call (8), four refusals, and never the raw key:\n%s", audit, logs.String())
	}
	// Issue 57: a read is routine (INFO); what changes a key stays WARN.
	if strings.Contains(logs.String(), `"level":"WARN","msg":"admin key API","method":"GET"`) || !strings.Contains(logs.String(), `"level":"INFO","msg":"admin key API","method":"GET"`) ||
		!strings.Contains(logs.String(), `"level":"WARN","msg":"admin key API","method":"DELETE"`) {
		t.Errorf("audit levels: want GET at INFO, DELETE at WARN:\n%s", logs.String())
	}
}

// mustScope is the key scope of the route name serves now.
func mustScope(t *testing.T, s *server, name string) string {
	t.Helper()
	scope, ok := s.handler.RouteScope(name)
	if !ok {
		t.Fatalf("no route %s", name)
	}
	return scope
}

// TestKeysAPIStream (issue 44): the key API shows a streamed answer's
// progress: state streamed, how it ended, the bytes stored.
func TestKeysAPIStream(t *testing.T) {
	srv := redistest.Start(t)
	hold := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "{\"row\":1}\n")
		http.NewResponseController(w).Flush()
		if r.Header.Get("Idempotency-Key") == "running" {
			<-hold // a stream that runs until the test ends
		}
		io.WriteString(w, "{\"row\":2}\n")
	}))
	defer upstream.Close()
	defer close(hold)
	cfg := lateConfig(srv, upstream.URL)
	cfg.Store.RecordFormat = 4
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-admin\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	cfg.Admin.TokenFile = tokenFile
	s, _ := startTest(t, cfg, "", slog.New(slog.DiscardHandler))
	if status, body := pay(t, s.clientAddr, "k1"); status != http.StatusOK || body != "{\"row\":1}\n{\"row\":2}\n" {
		t.Fatalf("export: %d %q", status, body)
	}
	_, b := getKey(t, s.adminAddr, "k1&body=true")
	for _, want := range []string{`"state":"streamed"`, `"status":200`, `"stream":{"end":"ended","bytes":20}`, `"body":"{\"row\":1}\n{\"row\":2}\n"`} {
		if !strings.Contains(b, want) {
			t.Errorf("GET of a streamed key lacks %s: %s", want, b)
		}
	}
	// A streamed answer is forgotten with state=streamed (the next retry
	// executes again), not with completed.
	del := func(state string) (int, string) {
		return deleteKey(t, s.adminAddr, "k1", state)
	}
	if status, body := del("completed"); status != http.StatusConflict {
		t.Errorf("delete state=completed of a streamed record: %d %s, want 409 left alone", status, body)
	}
	if status, body := del("streamed"); status != http.StatusOK || !strings.Contains(body, "deleted streamed") {
		t.Errorf("delete state=streamed: %d %s, want 200 deleted", status, body)
	}
	if status, body := pay(t, s.clientAddr, "k1"); status != http.StatusOK || body != "{\"row\":1}\n{\"row\":2}\n" {
		t.Errorf("the retry after the delete: %d %q", status, body)
	}
	// A running stream is left alone unless forced: its owner relays it.
	go func() {
		if resp, err := http.DefaultClient.Do(binarytest.PayRequest("http://"+s.clientAddr+"/payments", "running", "{}")); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	poll.Until(t, "the stream runs", func() bool {
		status, body := getKey(t, s.adminAddr, "running")
		return status == http.StatusOK && strings.Contains(body, `"end":"running"`)
	})
	if status, body := deleteKey(t, s.adminAddr, "running", "streamed"); status != http.StatusConflict || !strings.Contains(body, "the stream is running") {
		t.Errorf("delete of a running stream: %d %s, want 409 refused", status, body)
	}
	if status, body := deleteKey(t, s.adminAddr, "running", "streamed&force=true"); status != http.StatusOK {
		t.Errorf("forced delete of a running stream: %d %s, want 200", status, body)
	}
}

// deleteKey and getKey call the key API on admin for alice's key on pay.
func deleteKey(t *testing.T, admin, key, state string) (int, string) {
	t.Helper()
	return callKeyAPI(t, http.MethodDelete, "http://"+admin+"/v1/keys?route=pay&principal=alice&key="+key+"&state="+state)
}

func getKey(t *testing.T, admin, key string) (int, string) {
	t.Helper()
	return callKeyAPI(t, http.MethodGet, "http://"+admin+"/v1/keys?route=pay&principal=alice&key="+key)
}

func callKeyAPI(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef-admin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
