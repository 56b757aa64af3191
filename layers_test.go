package main

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// proxyLayers is proxy/'s files from the top down (issue 66): a file uses
// what the files below it declare. serve.go, the request's flow, is the
// top; config.go and the small parsers are the ground. A new file takes
// its place here.
var proxyLayers = []string{
	"serve.go", "reconcilekey.go",
	"follow.go", "pump.go", "answer.go", "respond.go", "repeatability.go", "clientwrite.go",
	"webhook.go", "admission.go", "forward.go", "firstsent.go", "fail.go", "reconcile.go", "owner.go", "authorize.go",
	"exchange.go", "attempt.go", "coalesce.go", "logline.go", "gate.go", "settle.go", "storecall.go",
	"front.go", "lookup.go", "handler.go", "protocol.go", "trace.go", "fanout.go", "identity.go", "unconfirmed.go",
	"liveness.go", "upgrade.go", "transport.go", "reply.go", "resume.go", "pool.go", "limits.go", "stream.go",
	"metrics.go", "route.go", "providers.go", "headers.go", "bodykey.go", "key.go",
	"config.go", "xfcc.go", "jwt.go", "grpc.go", "problem.go", "fingerprint.go", "doc.go",
}

// backUp are the references that run back up proxyLayers today, each
// with why it stays. The list only shrinks: a new one fails, and one
// that is gone must leave the list.
var backUp = map[string]string{
	// A type's methods in several files call each other both ways.
	"attempt.go -> reconcile.go": "the attempt asks reconcile about a key; reconciling's methods run the attempt's",
	"attempt.go -> firstsent.go": "a claim refused 412 (refuseUnrecorded) is the attempt's, read with first-sent's rules",
	"attempt.go -> follow.go":    "an attempt attaches to a stream; following it is the exchange's",
	"owner.go -> pump.go":        "the owner waits for the pump its answer started",
	"answer.go -> pump.go":       "a streamed answer starts its pump",
	"forward.go -> answer.go":    "the forwarders wire ReverseProxy's hooks, which answer.go implements",
	"respond.go -> follow.go":    "a stored stream still running is followed",
	"fanout.go -> storecall.go":  "shared stream reads run under the settle timeout",
}

// TestProxyLayers (issue 66): references between proxy/'s files run
// down proxyLayers, but for the ones backUp names. A reference is a use,
// resolved by go/types, of a declaration of another file: a package-level
// name, a method, or a field.
func TestProxyLayers(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("proxy/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var parsed []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		if !slices.Contains(proxyLayers, filepath.Base(f)) {
			t.Errorf("%s has no place in proxyLayers: put it below what it uses and above what uses it", f)
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
	}
	conf := types.Config{Importer: exportImporter(t, fset, "./proxy")}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	pkg, err := conf.Check("github.com/idemproxy/idemproxy/proxy", fset, parsed, info)
	if err != nil {
		t.Fatal(err)
	}
	level := func(pos token.Pos) int { return slices.Index(proxyLayers, filepath.Base(fset.Position(pos).Filename)) }
	found := map[string]bool{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !declaredForFiles(pkg, obj) {
			continue
		}
		from, to := level(id.Pos()), level(obj.Pos())
		if from < 0 || to < 0 || from <= to {
			continue
		}
		ref := proxyLayers[from] + " -> " + proxyLayers[to]
		if !found[ref] {
			found[ref] = true
			if _, ok := backUp[ref]; !ok {
				t.Errorf("%s: %s uses %s, declared in %s, above it in proxyLayers: move the declaration down, or the use up", fset.Position(id.Pos()), proxyLayers[from], obj.Name(), proxyLayers[to])
			}
		}
	}
	for ref := range backUp {
		if !found[ref] {
			t.Errorf("backUp names %s, which no longer runs back up: remove it", ref)
		}
	}
}

// declaredForFiles reports whether obj is one file can declare for
// another: a package-level name, a method or a field (not a local).
func declaredForFiles(pkg *types.Package, obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Var:
		return o.IsField() || o.Parent() == pkg.Scope()
	case *types.Func:
		return true
	}
	return obj.Parent() == pkg.Scope()
}

// exportImporter imports pkg's dependencies from the export data the go
// command keeps in its build cache (go list -export): seconds, where
// type-checking every dependency from source took 28-57 s.
func exportImporter(t *testing.T, fset *token.FileSet, pkg string) types.Importer {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{if .Export}}{{.ImportPath}}={{.Export}}{{end}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -export %s: %v", pkg, err)
	}
	exports := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(line, "="); ok {
			exports[path] = file
		}
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}
