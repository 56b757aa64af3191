package claim

import (
	"reflect"
	"testing"
)

// FuzzDecode: a corrupt or foreign value in Redis gives a clean error,
// never a panic or a record that does not survive its own round trip.
func FuzzDecode(f *testing.F) {
	f.Add(sampleRecord().Encode())
	f.Add((&Record{State: InProgress}).Encode())
	f.Add(compactSample().Encode())
	f.Add([]byte("hello"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			if r != nil {
				t.Fatal("a failed decode returned a record")
			}
			return
		}
		again, err := Decode(r.Encode())
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", r, again)
		}
	})
}
