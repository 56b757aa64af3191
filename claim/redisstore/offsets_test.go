package redisstore

import (
	"os"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/contract"
)

// TestScriptsNameTheRecordsFields (issue 77): the Lua scripts spell out
// no offset of a stored value (each names its field, rendered from
// claim.Fields), and every offset they read once rendered falls on a
// field of claim.Fields.
func TestScriptsNameTheRecordsFields(t *testing.T) {
	src, err := os.ReadFile("scripts.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := contract.CheckNoOffsets(t, "scripts.go", string(src)); n < 50 {
		t.Errorf("scripts.go names %d fields: the placeholders no longer match their text", n)
	}
	if n := contract.CheckOffsets(t, "scripts.go, rendered", claim.LuaLayout(string(src))); n < 50 {
		t.Errorf("checked %d offsets in the rendered Lua scripts: the forms no longer match their text", n)
	}
}
