package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestCompressionThroughTheBinary (issue 35): with store.record_format: 3
// and store.compression: zstd the running binary stores a JSON answer's
// body compressed (smaller, flagged, in Redis) and replays it byte for
// byte; with the default record_format 1 the same setting writes nothing
// compressed (-check warns), so v0.4.0 replicas can still read it.
func TestCompressionThroughTheBinary(t *testing.T) {
	var body bytes.Buffer
	body.WriteString(`{"object":"list","data":[`)
	for i := 0; body.Len() < 3000; i++ {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"id":"pi_%024x","object":"payment_intent","amount":%d,"currency":"eur","status":"succeeded"}`, i*7919, 1000+i)
	}
	body.WriteString(`]}`)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body.Bytes())
	}))
	defer upstream.Close()
	for _, tc := range []struct {
		format     int
		compressed bool
	}{{3, true}, {1, false}} {
		t.Run(fmt.Sprintf("record_format %d", tc.format), func(t *testing.T) {
			srv := redistest.Start(t)
			sc := startBinary(t, fmt.Sprintf("upstream:\n  url: %q\nstore:\n  redis:\n    addrs: [%q]\n  record_format: %d\n  compression: zstd\nroutes:\n  - name: pay\n    match: \"POST /payments\"\n", upstream.URL, srv.Addr, tc.format))
			if status, b := post(t, sc.client+"/payments", "k", `{}`); status != http.StatusCreated || b != body.String() {
				t.Fatalf("first attempt: %d, body equal %t", status, b == body.String())
			}
			key := claim.New(srv.Client(), "idem:").Key("alice", proxy.KeyScope("pay", false), "k")
			raw, err := srv.Client().Get(context.Background(), key).Bytes()
			if err != nil {
				t.Fatal(err)
			}
			rec, err := claim.Decode(raw)
			if err != nil {
				t.Fatal(err)
			}
			if rec.BodyCompressed != tc.compressed || tc.compressed && len(raw) > body.Len()/2 {
				t.Errorf("stored: compressed %t, %d bytes for a %d-byte answer; want compressed %t", rec.BodyCompressed, len(raw), body.Len(), tc.compressed)
			}
			if status, b := post(t, sc.client+"/payments", "k", `{}`); status != http.StatusCreated || b != body.String() {
				t.Errorf("the replay: %d, body equal %t", status, b == body.String())
			}
		})
	}
}
