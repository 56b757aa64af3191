package pgstore

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestEncodeArgsKeepsEmptyApartFromNull: an empty value goes out as an
// empty parameter, a NULL as none, as pgx sends them itself (a buffer
// that started nil made the two alike), and each parameter keeps its own
// bytes however the shared buffer grew.
func TestEncodeArgsKeepsEmptyApartFromNull(t *testing.T) {
	sd := &pgconn.StatementDescription{ParamOIDs: []uint32{pgtype.TextOID, pgtype.ByteaOID, pgtype.TextOID, pgtype.ByteaOID, pgtype.Int8OID, pgtype.ByteaOID}}
	var none *string
	big := make([]byte, 1000) // past the buffer's first capacity
	big[999] = 9
	params, err := encodeArgs(pgtype.NewMap(), sd, []any{"", []byte{}, none, []byte(nil), int64(7), big})
	if err != nil {
		t.Fatal(err)
	}
	if params[0] == nil || len(params[0]) != 0 || params[1] == nil || len(params[1]) != 0 {
		t.Errorf("empty text and bytea = %q, %q; want empty, not NULL (nil)", params[0], params[1])
	}
	if params[2] != nil || params[3] != nil {
		t.Errorf("a nil *string and a nil []byte = %q, %q; want NULL (nil)", params[2], params[3])
	}
	if len(params[4]) != 8 || params[4][7] != 7 || len(params[5]) != 1000 || params[5][999] != 9 {
		t.Errorf("int8 %v, bytea of %d bytes: not their own values", params[4], len(params[5]))
	}
}
