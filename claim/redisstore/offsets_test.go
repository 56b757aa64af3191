package redisstore

import (
	"os"
	"testing"

	"github.com/idemproxy/idemproxy/claim/contract"
)

// TestScriptOffsetsAreTheRecords: every literal offset the Lua scripts
// read a stored value by falls on a field of claim.Fields.
func TestScriptOffsetsAreTheRecords(t *testing.T) {
	src, err := os.ReadFile("scripts.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := contract.CheckOffsets(t, "scripts.go", string(src)); n < 40 {
		t.Errorf("checked %d offsets in the Lua scripts: the forms no longer match their text", n)
	}
}
