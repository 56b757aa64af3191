package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// productDirs hold the code the binary ships, and the contract every
// store passes.
var productDirs = []string{".", "proxy", "claim", "claim/redisstore", "claim/pgstore", "claim/contract", "config", "internal/sizing", "internal/problemfmt", "internal/jsonpointer"}

// harnessDirs hold harnesses that fall under the same rule: the bench,
// whose functions grew with every target (issue 77).
var harnessDirs = []string{"bench"}

// maxFuncLines is the most lines a product function's body may take
// (CONTRIBUTING.md: long functions are where cases hide).
const maxFuncLines = 60

// longFuncs are the product functions allowed past maxFuncLines, each at
// most as long as it is today: the declarations (a table of metrics, the
// demo's script), which read best whole; at most maxLongFuncs of them.
// The list only shrinks: a function that grows past its length fails,
// and one back under maxFuncLines must leave the list.
// maxLongFuncs is how many functions longFuncs may name.
const maxLongFuncs = 3

var longFuncs = map[string]int{
	// Declarations: one metric, or one demo step, after another.
	"proxy.NewMetrics":  150,
	"main.runDemo":      92,
	"main.demoShow.run": 94,
}

// TestProductFunctionsStayShort (issue 54): CI fails when a product
// function's body (or one of the bench's) passes 60 lines, but for the
// ones longFuncs names, which may not grow.
func TestProductFunctionsStayShort(t *testing.T) {
	if len(longFuncs) > maxLongFuncs {
		t.Errorf("%d product functions may pass %d lines, more than %d: split one", len(longFuncs), maxFuncLines, maxLongFuncs)
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, dir := range append(slices.Clone(productDirs), harnessDirs...) {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				name := pkgOf(dir) + "." + funcName(fd)
				n := fset.Position(fd.Body.Rbrace).Line - fset.Position(fd.Body.Lbrace).Line - 1
				allowed, listed := longFuncs[name]
				switch {
				case listed && n <= maxFuncLines:
					t.Errorf("%s (%s) is %d lines now: remove it from longFuncs", name, f, n)
				case listed && n > allowed:
					t.Errorf("%s (%s) grew to %d lines, past the %d it is allowed: split it by case", name, f, n, allowed)
				case !listed && n > maxFuncLines:
					t.Errorf("%s (%s) is %d lines, past %d: split it by case (CONTRIBUTING.md)", name, f, n, maxFuncLines)
				}
				seen[name] = true
			}
		}
	}
	for name := range longFuncs {
		if !seen[name] {
			t.Errorf("longFuncs names %s, which no product file declares: remove it", name)
		}
	}
}

// pkgOf is the name of dir's package: main for the top.
func pkgOf(dir string) string {
	if dir == "." {
		return "main"
	}
	return filepath.Base(dir)
}

// funcName is fd's name, with its receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
