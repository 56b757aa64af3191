package pgstore

import (
	"testing"

	"github.com/idemproxy/idemproxy/claim/contract"
)

// TestSchemaOffsetsAreTheRecords: every literal offset schema.sql reads
// a stored value by falls on a field of claim.Fields.
func TestSchemaOffsetsAreTheRecords(t *testing.T) {
	if n := contract.CheckOffsets(t, "schema.sql", schemaSQL); n < 30 {
		t.Errorf("checked %d offsets in schema.sql: the forms no longer match its text", n)
	}
}
