package proxy

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReadmeListsEveryProblemType: the README's table of problem types
// has a row for every problem the proxy can answer, with its status, as
// config's reference test does for the config keys.
func TestReadmeListsEveryProblemType(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // type -> status column
	row := regexp.MustCompile("(?m)^\\| ([0-9/]+) \\| `([a-z-]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		rows[m[2]] = m[1]
	}
	// Every problem declared in problem.go is in the list.
	src, err := os.ReadFile("problem.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := regexp.MustCompile(`(?m)^\s+prob\w+\s+= problem\{`).FindAllString(string(src), -1)
	if len(declared) != len(problems) {
		t.Errorf("problem.go declares %d problems, the problems list holds %d: add the new one to it", len(declared), len(problems))
	}
	for _, p := range problems {
		status, ok := rows[p.Type]
		if !ok {
			t.Errorf("README's Responses table has no row for problem type %s (%d)", p.Type, p.Status)
			continue
		}
		if !strings.Contains(status, strconv.Itoa(p.Status)) {
			t.Errorf("README lists %s as %s, the proxy answers it %d", p.Type, status, p.Status)
		}
	}
}
