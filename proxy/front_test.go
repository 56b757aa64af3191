package proxy

import (
	"bytes"
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
)

// TestFrontWithoutAnHTTPRequest (issue 66): a front that is not an HTTP
// request (a gRPC call, an Envoy ext_proc message) serves a key through
// the attempt alone: it claims, forwards through a function it is given,
// renews, settles and answers; its retry replays the stored answer, and
// a retry while it runs is told so. Nothing here builds an
// *http.Request.
func TestFrontWithoutAnHTTPRequest(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:1")
	cfg.Routes = []Route{testRoute("pay", "POST /payments")}
	h, err := New(cfg, embeddedStore(t, "front:"), Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rt := h.routes.Load().byName["pay"]
	body := []byte(`{"amount":1250}`)
	fp := rt.fp.sum("POST", "/payments", "", http.Header{}, body)

	// serve is the whole front: the attempt decides, or it owns the key
	// and forwards through forward, renewing while it runs.
	executed := 0
	serve := func(requestID string, forward func(*holding) (int, []byte)) *reply {
		a := h.p.newFront(context.Background(), rt, requestID).newAttempt(admittedAs{principal: "alice", key: "order-42"})
		rec := a.newClaim(fp)
		held, rep := a.ownOrAnswer(rec, body, nil)
		if held == nil {
			return rep
		}
		defer held.slot.give()
		status, answer := forward(held)
		done := settledRecord(rec, rec.Token, claim.Completed, status, http.Header{"Content-Type": {"application/json"}}, h.p.now())
		done.Body = answer
		v := held.complete(done)
		return &reply{outcome: v.outcome, detail: v.detail, record: done}
	}

	var during *reply
	first := serve("req-1", func(held *holding) (int, []byte) {
		executed++
		if !held.renew() {
			t.Error("renewing the claim it holds: lost")
		}
		during = serve("req-2", func(*holding) (int, []byte) {
			executed++
			return 500, nil
		})
		return http.StatusCreated, []byte(`{"id":"ch_1"}`)
	})
	if first.outcome != outcomeStored || first.record == nil || first.record.Status != http.StatusCreated {
		t.Fatalf("first attempt: %+v, want stored 201", first)
	}
	if during == nil || during.outcome != outcomeConflict || during.problem.Status != http.StatusConflict {
		t.Fatalf("a retry while the first ran: %+v, want 409 conflict", during)
	}
	again := serve("req-3", func(*holding) (int, []byte) {
		executed++
		return 500, nil
	})
	if again.outcome != outcomeReplayed || !again.replayed || again.record == nil ||
		again.record.Status != http.StatusCreated || !bytes.Equal(again.record.Body, []byte(`{"id":"ch_1"}`)) || again.record.RequestID != "req-1" {
		t.Fatalf("the retry: %+v, want the first answer replayed", again)
	}
	if executed != 1 {
		t.Fatalf("forwarded %d times, want once", executed)
	}

	// A settlement that frees the key: the next attempt executes.
	a := h.p.newFront(context.Background(), rt, "req-5").newAttempt(admittedAs{principal: "alice", key: "order-43"})
	rec := a.newClaim(fp)
	held, rep := a.ownOrAnswer(rec, body, nil)
	if held == nil {
		t.Fatalf("a new key: %+v, want it owned", rep)
	}
	v := held.release("the upstream said 503")
	held.slot.give()
	if v.outcome != outcomeReleased {
		t.Fatalf("release: %+v", v)
	}
	b := h.p.newFront(context.Background(), rt, "req-6").newAttempt(admittedAs{principal: "alice", key: "order-43"})
	if held, rep := b.ownOrAnswer(b.newClaim(fp), body, nil); held == nil {
		t.Fatalf("the key released: %+v, want the retry to own it", rep)
	} else {
		held.slot.give()
	}
}

// TestFrontFailsWithoutAnHTTPRequest (issue 77): a front that is not an
// HTTP request fails its calls through the holding alone, with no
// exchange and no owner: it tells the protocol only whether the call was
// sent and whether it ran out of time, and gets the reply that settled
// the key, once. Not sent frees the key; sent and unknown: keep holds it
// (a retry is told it runs), release frees it, fail stores the
// outcome-unknown answer as the route's front framed it (replayed to the
// retry); on a reconcile route the upstream is asked first (found: its
// answer stored and replayed; unresolved: unknown_outcome applies). A
// claim confirmed too late is released, nothing sent.
func TestFrontFailsWithoutAnHTTPRequest(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:1")
	keep, release, fail, rc := testRoute("keep", "POST /keep"), testRoute("release", "POST /release"), testRoute("fail", "POST /fail"), testRoute("rc", "POST /rc")
	keep.Unknown, release.Unknown, fail.Unknown, rc.Unknown = Keep, Release, Fail, Fail
	rc.Reconcile = &Reconcile{URL: "/lookup/{key}", Found: []int{200}, Absent: []int{404}, Timeout: time.Second, AbsentAfter: time.Hour}
	cfg.Routes = []Route{keep, release, fail, rc}
	h, err := New(cfg, embeddedStore(t, "fails:"), Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lookups := map[string]lookupAnswer{}
	h.p.lookup = func(_ context.Context, _ *route, _, key string, _ int64) lookupAnswer {
		if ans, ok := lookups[key]; ok {
			return ans
		}
		return lookupAnswer{result: lookupUnresolved, why: "no ledger"}
	}
	body := []byte(`{"amount":1250}`)
	newAttempt := func(route, key string) *attempt {
		rt := h.routes.Load().byName[route]
		return h.p.newFront(context.Background(), rt, "req-"+key).newAttempt(admittedAs{principal: "alice", key: key})
	}
	claimFor := func(route, key string) (*attempt, *holding, *reply) {
		a := newAttempt(route, key)
		held, rep := a.ownOrAnswer(a.newClaim(a.rt.fp.sum("POST", "/"+route, "", http.Header{}, body)), body, nil)
		if held != nil {
			held.keepAlive()
			t.Cleanup(func() { held.settle(nil); held.slot.give() })
		}
		return a, held, rep
	}
	// failed is one first attempt whose call failed with err: its reply.
	failed := func(route, key string, sent, timedOut bool, err error) *reply {
		_, held, rep := claimFor(route, key)
		if held == nil {
			t.Fatalf("%s %s: %+v, want it owned", route, key, rep)
		}
		v := held.fail(sent, timedOut, err)
		by := held.settled()
		if again := held.fail(sent, timedOut, err); again.outcome != v.outcome || held.settled() != by {
			t.Errorf("%s %s: failed again: %+v, settled by %+v then %+v, want it settled once", route, key, again, by, held.settled())
		}
		if later := held.complete(&claim.Record{}); later != held.settled() {
			t.Errorf("%s %s: a completion after the failure settled again: %+v", route, key, later)
		}
		return v
	}
	owned := func(route, key string) bool {
		_, held, _ := claimFor(route, key)
		return held != nil
	}
	reset := errors.New("connection reset by peer")

	if v := failed("fail", "never-sent", false, false, errors.New("dial tcp: connection refused")); v.outcome != outcomeReleased || v.problem.Status != http.StatusBadGateway || v.problem.Type != probUpstreamDown.Type {
		t.Errorf("a call never sent: %+v, want released, 502 upstream-unreachable", v)
	}
	if !owned("fail", "never-sent") {
		t.Error("a call never sent: the retry does not own the key")
	}
	if v := failed("keep", "k", true, false, reset); v.outcome != outcomeClaimed || v.unknown == "" || v.problem.Type != probUpstreamFailed.Type {
		t.Errorf("keep: %+v, want the claim kept, upstream-failed, the outcome unknown", v)
	}
	if _, held, rep := claimFor("keep", "k"); held != nil || rep.outcome != outcomeConflict {
		t.Errorf("keep: the retry got %+v, want 409: the claim is held one more lease", rep)
	}
	if v := failed("release", "r", true, true, context.DeadlineExceeded); v.outcome != outcomeReleased || v.problem.Type != probUpstreamTimeout.Type {
		t.Errorf("release: %+v, want released, upstream-timeout", v)
	}
	if !owned("release", "r") {
		t.Error("release: the retry does not own the key")
	}
	v := failed("fail", "f", true, false, reset)
	if v.outcome != outcomeStored || v.record == nil || v.record.Status != http.StatusBadGateway || v.record.Header.Get("Content-Type") != problemContentType ||
		!strings.Contains(string(v.record.Body), "outcome-unknown") {
		t.Fatalf("fail: %+v, want the outcome-unknown answer stored as problem+json", v)
	}
	if _, held, rep := claimFor("fail", "f"); held != nil || rep.outcome != outcomeReplayed || !bytes.Equal(rep.record.Body, v.record.Body) {
		t.Errorf("fail: the retry got %+v, want the stored outcome-unknown replayed", rep)
	}
	lookups["found"] = lookupAnswer{result: lookupFound, status: http.StatusCreated, header: http.Header{"Content-Type": {"application/json"}}, body: []byte(`{"id":"ch_9"}`)}
	if v := failed("rc", "found", true, true, context.DeadlineExceeded); v.outcome != outcomeReconciled || v.record == nil || v.record.Status != http.StatusCreated {
		t.Errorf("reconcile, found: %+v, want the upstream's answer stored", v)
	}
	if _, held, rep := claimFor("rc", "found"); held != nil || rep.outcome != outcomeReplayed || string(rep.record.Body) != `{"id":"ch_9"}` {
		t.Errorf("reconcile, found: the retry got %+v, want the found answer replayed", rep)
	}
	if v := failed("rc", "unresolved", true, false, reset); v.outcome != outcomeStored || v.record == nil || v.record.Header.Get(unknownSinceHeader) == "" {
		t.Errorf("reconcile, unresolved: %+v, want outcome-unknown stored (fail), marked for the next lookup", v)
	}
	_, held, _ := claimFor("fail", "too-late")
	if v := held.fail(false, false, errClaimTooLate); v.outcome != outcomeStoreUnavailable || held.settled().outcome != outcomeReleased {
		t.Errorf("confirmed too late: %+v (settled %+v), want store-unavailable, released", v, held.settled())
	}
	if !owned("fail", "too-late") {
		t.Error("confirmed too late: the retry does not own the key")
	}
}

// embeddedStore is a store on the embedded Redis (miniredis), for the
// unit tests and benchmarks of what runs above the store, its keys under
// prefix.
func embeddedStore(tb testing.TB, prefix string) *redisstore.Store {
	tb.Helper()
	emb, err := redisstore.StartEmbedded()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(emb.Close)
	client, err := redisstore.NewClient(redisstore.ClientOptions{Addrs: []string{emb.Addr()}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	store := redisstore.New(client, prefix)
	tb.Cleanup(store.Close)
	return store
}

// TestAttemptBuiltWhole (issue 66): the exchange holds its attempt as a
// named field, never embedded, and builds it whole once the request is
// admitted (front.newAttempt): nothing outside the attempt's own methods
// writes a field of it in later. The exchange stays at most 20 fields,
// and no type of the package passes 30 methods of its own (issue 77).
func TestAttemptBuiltWhole(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				exchangeFields(t, d)
			case *ast.FuncDecl:
				recv := receiverName(d)
				if recv != "" {
					methods[recv]++
				}
				if recv != "attempt" && d.Body != nil {
					for _, w := range attemptWrites(d.Body) {
						t.Errorf("%s: %s writes %s: the attempt is built whole by newAttempt, and only its own methods change it", fset.Position(w.Pos()), d.Name.Name, render(w))
					}
				}
			}
		}
	}
	for typ, n := range methods {
		if n > 30 {
			t.Errorf("%s has %d methods of its own, more than 30: the next god object (issue 77: no type in proxy/ over 30)", typ, n)
		}
	}
	if methods["exchange"] == 0 || methods["attempt"] == 0 {
		t.Errorf("counted no methods of the exchange or the attempt: %v", methods)
	}
}

// TestNothingEmbedsTheProtocol (issue 77): no struct of the package
// embeds one of the package's own types, whose methods and fields would
// then read as the embedder's (the exchange once embedded its front and
// its buffers, the attempt its front): each is held as a named field.
// Wrapping an interface of another package for delegation
// (http.ResponseWriter, io.Reader) stays.
func TestNothingEmbedsTheProtocol(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			checked++
			for _, field := range st.Fields.List {
				typ := field.Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if _, own := typ.(*ast.Ident); own && len(field.Names) == 0 {
					t.Errorf("%s: %s embeds %s, a type of its own package: hold it as a named field", fset.Position(field.Pos()), ts.Name.Name, render(field.Type))
				}
			}
			return true
		})
	}
	if checked < 50 {
		t.Errorf("checked %d structs: the files were not read", checked)
	}
}

// exchangeFields checks the exchange's declaration, when d holds it.
func exchangeFields(t *testing.T, d *ast.GenDecl) {
	for _, s := range d.Specs {
		ts, ok := s.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "exchange" {
			continue
		}
		st := ts.Type.(*ast.StructType)
		n := 0
		for _, f := range st.Fields.List {
			n += max(1, len(f.Names))
			if embedded := render(f.Type); len(f.Names) == 0 && (embedded == "attempt" || embedded == "*attempt") {
				t.Error("the exchange embeds its attempt: hold it as a named field")
			}
		}
		if n > 20 {
			t.Errorf("the exchange has %d fields, more than 20", n)
		}
	}
}

// receiverName is the type fd is a method of, "" for a function.
func receiverName(fd *ast.FuncDecl) string {
	if fd.Recv == nil {
		return ""
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// attemptWrites are the assignments in body to a field of an attempt held
// as a field a (x.a.principal = …, o.x.a.hashedKey++).
func attemptWrites(body *ast.BlockStmt) []ast.Expr {
	var out []ast.Expr
	ofAttempt := func(e ast.Expr) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		inner, ok := sel.X.(*ast.SelectorExpr)
		return ok && inner.Sel.Name == "a"
	}
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for _, l := range n.Lhs {
				if ofAttempt(l) {
					out = append(out, l)
				}
			}
		case *ast.IncDecStmt:
			if ofAttempt(n.X) {
				out = append(out, n.X)
			}
		}
		return true
	})
	return out
}

// render is e as source.
func render(e ast.Expr) string {
	var b strings.Builder
	_ = printer.Fprint(&b, token.NewFileSet(), e)
	return b.String()
}
