package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/idemproxy/idemproxy/claim"
	"github.com/idemproxy/idemproxy/claim/redisstore"
	"github.com/idemproxy/idemproxy/internal/binarytest"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

// TestCompressionThroughTheBinary (issue 35): with store.record_format: 3
// the running binary stores completed records in the compact layout, and
// with store.compression: zstd a JSON answer's body compressed (smaller,
// flagged), on Redis and on PostgreSQL alike, and replays the answer byte
// for byte, headers included; with the default record_format 1 it writes
// neither (-check warns), so v0.4.0 replicas can still read every record.
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
		format      int
		compression string
		compressed  bool
		compact     bool
	}{{3, "zstd", true, true}, {3, "none", false, true}, {1, "zstd", false, false}} {
		t.Run(fmt.Sprintf("record_format %d compression %s", tc.format, tc.compression), func(t *testing.T) {
			eachStoreValues(t, func(t *testing.T, config func(upstream, extra string) string, values storeValues) {
				sc := startBinary(t, config(upstream.URL, fmt.Sprintf("  record_format: %d\n  compression: %s\n", tc.format, tc.compression)))
				first, b := postAnswer(t, sc.Client+"/payments", "k", `{}`)
				if first.StatusCode != http.StatusCreated || b != body.String() {
					t.Fatalf("first attempt: %d, body equal %t", first.StatusCode, b == body.String())
				}
				key := claim.NewCodec("idem:").Key("alice", proxy.KeyScope("pay", false), "k")
				raw, ok := values(t)[key]
				if !ok {
					t.Fatalf("no record under %s", key)
				}
				rec, err := claim.Decode(raw)
				if err != nil {
					t.Fatal(err)
				}
				if rec.BodyCompressed != tc.compressed || tc.compressed && len(raw) > body.Len()/2 || rec.Compact != tc.compact {
					t.Errorf("stored: compressed %t, compact %t, %d bytes for a %d-byte answer; want compressed %t, compact %t",
						rec.BodyCompressed, rec.Compact, len(raw), body.Len(), tc.compressed, tc.compact)
				}
				replay, b := postAnswer(t, sc.Client+"/payments", "k", `{}`)
				if replay.StatusCode != http.StatusCreated || b != body.String() {
					t.Errorf("the replay: %d, body equal %t", replay.StatusCode, b == body.String())
				}
				for _, h := range []string{"Content-Type", "Content-Length", "Date", "X-Request-Id"} {
					if got, want := replay.Header.Values(h), first.Header.Values(h); !slices.Equal(got, want) {
						t.Errorf("replayed %s: %q, first answer's %q", h, got, want)
					}
				}
			})
		})
	}
}

// TestSealedRecordsKeyTheirFingerprints (issue 41, item 4): with sealing
// (store.encryption.key_files) and no store.key_secret_file, format 3
// keys the stored fingerprint with a subkey of the sealing keys' own
// derivation, so a sealed record carries nothing a guessed body can be
// checked against (format 1, the default, writes plain ones, which
// v0.5.0 reads); the Redis key is derived as before. Replays and 422s
// work on keyed fingerprints.
func TestSealedRecordsKeyTheirFingerprints(t *testing.T) {
	up := binarytest.NewRecorder(t)
	seal := bytes.Repeat([]byte{7}, claim.KeySize)
	file := filepath.Join(t.TempDir(), "seal")
	if err := os.WriteFile(file, []byte(base64.StdEncoding.EncodeToString(seal)), 0o400); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		format int
		keyed  bool
	}{{3, true}, {1, false}} {
		t.Run(fmt.Sprintf("record_format %d", tc.format), func(t *testing.T) {
			eachStoreValues(t, func(t *testing.T, config func(upstream, extra string) string, values storeValues) {
				sc := startBinary(t, config(up.URL, fmt.Sprintf("  record_format: %d\n  encryption:\n    key_files: [%q]\n", tc.format, file)))
				key := fmt.Sprintf("sealed-%d-%s", tc.format, strings.ReplaceAll(t.Name(), "/", "-"))
				first, b := postAnswer(t, sc.Client+"/payments", key, `{"amount":1}`)
				if first.StatusCode != http.StatusCreated {
					t.Fatalf("first attempt: %d %s", first.StatusCode, b)
				}
				opt, err := claim.WithSealing([][]byte{seal}, true, nil)
				if err != nil {
					t.Fatal(err)
				}
				codec := claim.NewCodec("idem:", opt)
				storeKey := codec.Key("alice", proxy.KeyScope("pay", false), key)
				raw, ok := values(t)[storeKey]
				if !ok {
					t.Fatalf("no record under the key derived as before, %s", storeKey)
				}
				rec, err := codec.Open(storeKey, raw)
				if err != nil || rec == nil {
					t.Fatalf("the record, opened: %v %v", rec, err)
				}
				if rec.KeyedFingerprint != tc.keyed {
					t.Errorf("stored fingerprint keyed: %t, want %t", rec.KeyedFingerprint, tc.keyed)
				}
				if replay, rb := postAnswer(t, sc.Client+"/payments", key, `{"amount":1}`); replay.StatusCode != http.StatusCreated || rb != b {
					t.Errorf("the retry: %d %s, want the first answer replayed", replay.StatusCode, rb)
				}
				if other, ob := postAnswer(t, sc.Client+"/payments", key, `{"amount":2}`); other.StatusCode != http.StatusUnprocessableEntity {
					t.Errorf("the key with another body: %d %s, want 422", other.StatusCode, ob)
				}
				if n := up.Executions(key); n != 1 {
					t.Errorf("executed %d times, want 1", n)
				}
			})
		})
	}
}

// TestPlantedCompressedBodiesAreBounded (issue 41, item 5), through the
// binary: a record planted in Redis whose zstd body inflates to more than
// the route's max_response_body (8 MiB from 1 KiB stored) is answered 409
// response-not-replayable without being inflated; one within it is
// inflated into the buffer budget, so past the principal's share of
// limits.max_buffered_bytes it is 429 too-many-bytes, not held outside
// the budget. Before, both were inflated on read (up to a fixed 64 MiB)
// and replayed.
func TestPlantedCompressedBodiesAreBounded(t *testing.T) {
	up := binarytest.NewRecorder(t)
	srv := redistest.Start(t)
	sc := startBinary(t, payConfig(up.URL, srv.Addr, "  record_format: 3\n  compression: zstd\nlimits:\n  max_buffered_bytes: 1048576\n  principal_share: 25%\n"))
	ctx := context.Background()
	st := redisstore.New(srv.Client(), "idem:")
	plant := func(key string, inflated int) {
		t.Helper()
		if r, b := postAnswer(t, sc.Client+"/payments", key, `{}`); r.StatusCode != http.StatusCreated {
			t.Fatalf("first attempt: %d %s", r.StatusCode, b)
		}
		rkey := st.Codec().Key("alice", proxy.KeyScope("pay", false), key)
		raw, err := srv.Client().Get(ctx, rkey).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		rec, err := claim.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := zstd.NewWriter(nil)
		rec.Body, rec.BodyCompressed = enc.EncodeAll(bytes.Repeat([]byte("A"), inflated), nil), true
		if err := srv.Client().Set(ctx, rkey, rec.Encode(), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	plant("bomb", 8<<20)
	if r, b := postAnswer(t, sc.Client+"/payments", "bomb", `{}`); r.StatusCode != http.StatusConflict || !strings.Contains(b, "response-not-replayable") {
		t.Errorf("a planted body inflating to 8 MiB, over max_response_body: %d (%d bytes), want 409 response-not-replayable", r.StatusCode, len(b))
	}
	plant("within", 512<<10) // within max_response_body, over the 256 KiB share
	if r, b := postAnswer(t, sc.Client+"/payments", "within", `{}`); r.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, "too-many-bytes") {
		t.Errorf("a planted body inflating to 512 KiB, over the principal's 256 KiB share: %d (%d bytes), want 429 too-many-bytes", r.StatusCode, len(b))
	}
	if n := up.Total(); n != 2 {
		t.Errorf("the upstream ran %d times, want 2 (the first attempts)", n)
	}
}
