package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// TestJWKSStarvationThroughTheBinary (issue 24, finding 1), on the wire:
// the issuer rotates to a new key while four clients flood requests that
// name unknown key ids and hang up at once; every request with a token of
// the rotated key still succeeds. Before, the refetch ran under the
// attacker's request context and the rate-limit clock started before it,
// and 71 of 71 valid requests got 401.
func TestJWKSStarvationThroughTheBinary(t *testing.T) {
	t.Parallel() // binary-level, on its own ports and store: runs beside the others (go test ./... time)
	keys := map[string]*ecdsa.PrivateKey{}
	for _, kid := range []string{"k1", "k2", "k3"} {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys[kid] = k
	}
	var mu sync.Mutex
	served := []string{"k1"}
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond) // a remote issuer
		mu.Lock()
		defer mu.Unlock()
		var set jose.JSONWebKeySet
		for _, kid := range served {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: &keys[kid].PublicKey, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"})
		}
		json.NewEncoder(w).Encode(set)
	}))
	defer jwks.Close()
	token := func(kid string) string {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: keys[kid]}, (&jose.SignerOptions{}).WithHeader("kid", kid).WithType("JWT"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: "https://issuer.example", Subject: "alice", Audience: jwt.Audience{"payments"}, Expiry: jwt.NewNumericDate(time.Now().Add(time.Hour))}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	var executed atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		executed.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer upstream.Close()
	sc := startBinary(t, fmt.Sprintf(`upstream:
  url: %q
identity:
  source: jwt
  trusted_proxies: ["192.0.2.0/24"]
  jwt:
    jwks_url: %q
    issuer: "https://issuer.example"
    audience: [payments]
routes:
  - name: pay
    match: "POST /payments"
`, upstream.URL, jwks.URL))
	send := func(ctx context.Context, tok, key, body string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sc.Client+"/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if status := send(context.Background(), token("k1"), "warm", `{}`); status != http.StatusCreated {
		t.Fatalf("k1: %d", status)
	}
	mu.Lock()
	served = []string{"k1", "k2"}
	mu.Unlock()
	forged := token("k3") // never served
	stop := make(chan struct{})
	var attackers sync.WaitGroup
	for range 4 {
		attackers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				send(ctx, forged, "attack", "") // no body: the server watches the connection
				cancel()
			}
		})
	}
	time.Sleep(1100 * time.Millisecond) // past the refetch rate limit of the warm-up's fetch
	ok := 0
	for i := range 10 {
		if send(context.Background(), token("k2"), fmt.Sprintf("rotated-%d", i), `{}`) == http.StatusCreated {
			ok++
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	attackers.Wait()
	if ok != 10 {
		t.Errorf("%d of 10 valid requests with the rotated key succeeded under a flood of unknown key ids, want 10", ok)
	}
}
