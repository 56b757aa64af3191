package proxy

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

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
// writes a field of it in later. The exchange stays at most 20 fields and
// 30 methods of its own.
func TestAttemptBuiltWhole(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	methods := 0
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
				if recv == "exchange" {
					methods++
				}
				if recv != "attempt" && d.Body != nil {
					for _, w := range attemptWrites(d.Body) {
						t.Errorf("%s: %s writes %s: the attempt is built whole by newAttempt, and only its own methods change it", fset.Position(w.Pos()), d.Name.Name, render(w))
					}
				}
			}
		}
	}
	if methods > 30 {
		t.Errorf("the exchange has %d methods of its own, more than 30", methods)
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
