package contract

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
)

// The record's fixed offsets have one source, claim.Fields. The Lua
// scripts, schema.sql and the SQL a backend builds in Go name the fields
// they read by placeholders ({{rec.token}}) that claim.LuaLayout and
// claim.SQLLayout render. CheckNoOffsets holds a copy's source to that:
// it may spell out no offset of its own. CheckOffsets holds the rendered
// text to the declaration: every byte range it reads or writes by a
// literal offset must begin where a field of claim.Fields begins, end
// where one ends, and hold no byte that no field covers.

// offsetForms are the ways the scripts name a byte range by literal
// numbers, each with how to turn its numbers into a 0-based [start, end).
var offsetForms = []struct {
	re    *regexp.Regexp
	rng   func(n []int) (start, end int)
	ended bool // the range's end is the value's: only its start is checked
}{
	// Lua, 1-based and inclusive.
	{re: regexp.MustCompile(`string\.byte\(\w+, (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, n[0] }},
	{re: regexp.MustCompile(`string\.byte\(\w+, (\d+), (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, n[1] }},
	{re: regexp.MustCompile(`string\.sub\(\w+, (\d+), (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, n[1] }},
	{re: regexp.MustCompile(`string\.sub\(\w+, (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, -1 }, ended: true},
	{re: regexp.MustCompile(`rd8\(\w+, (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, n[0] + 7 }},
	// Redis' GETRANGE (0-based, inclusive) and SETRANGE (0-based, to the
	// value's end or the bytes written), numbers quoted or not.
	{re: regexp.MustCompile(`'GETRANGE', KEYS\[1\], '?(\d+)'?, '?(\d+)'?\)`), rng: func(n []int) (int, int) { return n[0], n[1] + 1 }},
	{re: regexp.MustCompile(`'GETRANGE', KEYS\[1\], '?(\d+)'?, [^'\d]`), rng: func(n []int) (int, int) { return n[0], -1 }, ended: true},
	{re: regexp.MustCompile(`'SETRANGE', KEYS\[1\], '?(\d+)'?,`), rng: func(n []int) (int, int) { return n[0], -1 }, ended: true},
	// SQL: substring and overlay 1-based, get_byte and set_byte 0-based,
	// substring(v, from, for) as the SQL built in Go writes it, a length
	// compared with a literal. (idem_rd8, 1-based, is rd8 above.)
	{re: regexp.MustCompile(`FROM (\d+) FOR (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, n[0] - 1 + n[1] }},
	{re: regexp.MustCompile(`[gs]et_byte\(\w+, (\d+)`), rng: func(n []int) (int, int) { return n[0], n[0] + 1 }},
	{re: regexp.MustCompile(`substring\(\w+(?:\.\w+)?, (\d+), (\d+)\)`), rng: func(n []int) (int, int) { return n[0] - 1, n[0] - 1 + n[1] }},
	{re: regexp.MustCompile(`length\(\w+(?:\.\w+)?\) *(?:<|>=|<=|>|=|<>) *(\d+)`), rng: func(n []int) (int, int) { return 0, n[0] }},
}

// CheckOffsets fails t for every literal offset in script (named what)
// that does not fall on a field boundary of claim.Fields, and returns how
// many it checked.
func CheckOffsets(t *testing.T, what, script string) int {
	t.Helper()
	starts, ends, covered := map[int]bool{0: true}, map[int]bool{0: true}, map[int]bool{}
	for _, f := range claim.Fields() {
		starts[f.Off], ends[f.Off+f.Len] = true, true
		for b := f.Off; b < f.Off+f.Len; b++ {
			covered[b] = true
		}
	}
	tiled := func(start, end int) bool {
		for b := start; b < end; b++ {
			if !covered[b] {
				return false
			}
		}
		return starts[start] && ends[end]
	}
	checked := 0
	for i, line := range strings.Split(script, "\n") {
		for _, form := range offsetForms {
			for _, m := range form.re.FindAllStringSubmatch(line, -1) {
				n := make([]int, len(m)-1)
				for j, s := range m[1:] {
					n[j], _ = strconv.Atoi(s)
				}
				start, end := form.rng(n)
				checked++
				if form.ended && !starts[start] || !form.ended && !tiled(start, end) {
					t.Errorf("%s:%d: %q reads bytes [%d, %s) of a stored value, which do not begin and end on a field of claim.Fields: %s", what, i+1, m[0], start, endText(end, form.ended), strings.TrimSpace(line))
				}
			}
		}
	}
	return checked
}

// endText is a range's end as the error says it.
func endText(end int, ended bool) string {
	if ended {
		return "the end"
	}
	return fmt.Sprint(end)
}

// CheckNoOffsets fails t for every offset that src, the source of a copy
// of the layout (named what), spells out as a number instead of naming
// its field ({{rec.NAME}}, rendered from claim.Fields); it returns how
// many placeholders src has. A length compared with 0 is no offset.
func CheckNoOffsets(t *testing.T, what, src string) int {
	t.Helper()
	for i, line := range strings.Split(src, "\n") {
		for _, form := range offsetForms {
			for _, m := range form.re.FindAllStringSubmatch(line, -1) {
				if len(m) == 2 && m[1] == "0" && strings.HasPrefix(m[0], "length(") {
					continue
				}
				t.Errorf("%s:%d: %q spells out an offset of a stored value: name its field instead ({{rec.NAME}}, claim.Fields): %s", what, i+1, m[0], strings.TrimSpace(line))
			}
		}
	}
	return strings.Count(src, "{{rec.")
}
