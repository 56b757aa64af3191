package proxy

import (
	"encoding/json"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/problemfmt"
)

// TestReadmeListsEveryProblemType: the docs/configuration.md's table of problem types
// has a row for every problem the proxy can answer, with its status, as
// config's reference test does for the config keys.
func TestReadmeListsEveryProblemType(t *testing.T) {
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // type -> status column
	row := regexp.MustCompile("(?m)^\\| ([0-9/]+) \\| `([a-z-]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		rows[m[2]] = m[1]
	}
	// Every problem in problem.go is made by declare, which lists it.
	src, err := os.ReadFile("problem.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := regexp.MustCompile(`(?m)^\s+prob\w+\s+= (declare\(|problem\{)`).FindAllString(string(src), -1)
	if len(declared) != len(problems) {
		t.Errorf("problem.go declares %d problems, the problems list holds %d: declare each with declare", len(declared), len(problems))
	}
	for _, p := range problems {
		status, ok := rows[p.Type]
		if !ok {
			t.Errorf("docs/configuration.md's Responses table has no row for problem type %s (%d)", p.Type, p.Status)
			continue
		}
		if !strings.Contains(status, strconv.Itoa(p.Status)) {
			t.Errorf("docs/configuration.md lists %s as %s, the proxy answers it %d", p.Type, status, p.Status)
		}
	}
}

// TestProblemBodyRendersEveryProblem: a problem_body renders valid JSON
// for every problem the proxy can answer, with its code, status and the
// Retry-After seconds when one is sent.
func TestProblemBodyRendersEveryProblem(t *testing.T) {
	f, err := problemfmt.Parse(`{"error":{"type":{{json .Code}},"uri":{{json .Type}},"title":{{json .Title}},"message":{{json .Detail}},"status":{{.Status}},"retry_after":{{.RetryAfter}},"request_id":{{json .RequestID}}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	pw := &problemWriter{base: problemTypePrefix, log: slog.New(slog.DiscardHandler)}
	for _, p := range problems {
		p = p.with(`a detail with "quotes" and \ and a newline
`)
		p.retryAfter = 1500 * time.Millisecond
		body, ct := pw.render(p, "rid-1", f)
		var got struct {
			Error struct {
				Type, URI  string
				Status     int
				RetryAfter int `json:"retry_after"`
			}
		}
		if ct != "application/json" || json.Unmarshal(body, &got) != nil {
			t.Errorf("%s: %s %s, want valid JSON", p.Type, ct, body)
			continue
		}
		if got.Error.Type != p.Type || got.Error.URI != problemTypePrefix+p.Type || got.Error.Status != p.Status || got.Error.RetryAfter != 2 {
			t.Errorf("%s: rendered %+v", p.Type, got.Error)
		}
	}
}
