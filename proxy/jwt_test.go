package proxy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/idemproxy/idemproxy/proxy"
)

// issuer is a JWKS endpoint whose keys the test rotates.
type issuer struct {
	mu   sync.Mutex
	keys map[string]*ecdsa.PrivateKey
	// served are the key ids the JWKS lists now.
	served []string
}

func (is *issuer) add(t *testing.T, kid string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.keys == nil {
		is.keys = map[string]*ecdsa.PrivateKey{}
	}
	is.keys[kid] = k
}

func (is *issuer) serve(kids ...string) {
	is.mu.Lock()
	is.served = kids
	is.mu.Unlock()
}

func (is *issuer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	is.mu.Lock()
	defer is.mu.Unlock()
	var set jose.JSONWebKeySet
	for _, kid := range is.served {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &is.keys[kid].PublicKey, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"})
	}
	json.NewEncoder(w).Encode(set)
}

func (is *issuer) token(t *testing.T, kid, sub string, aud []string, exp time.Time) string {
	is.mu.Lock()
	key := is.keys[kid]
	is.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", kid).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: "https://issuer.example", Subject: sub, Audience: aud, Expiry: jwt.NewNumericDate(exp), IssuedAt: jwt.NewNumericDate(time.Now())}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// identity.source jwt: the principal is a verified token's sub; keys are
// scoped by it; a rotated key set is fetched again; an expired token, a
// wrong audience, an unknown key or a forged signature is 401.
func TestJWTIdentity(t *testing.T) {
	is := &issuer{}
	is.add(t, "k1")
	is.add(t, "k2")
	is.serve("k1")
	jwks := httptest.NewServer(is)
	defer jwks.Close()
	e := newEnv(t, created, func(c *setup) {
		c.JWT = &proxy.JWTConfig{JWKSURL: jwks.URL, Issuer: "https://issuer.example", Audience: []string{"payments"}}
		untrusted(c) // the signature is the trust, not the peer
	})
	aud, soon := []string{"payments"}, time.Now().Add(time.Hour)
	as := func(tok, key string) resp {
		return e.do(req{key: key, body: `{}`, header: map[string]string{"Authorization": "Bearer " + tok}})
	}
	first := as(is.token(t, "k1", "alice", aud, soon), "k")
	if first.status != http.StatusCreated || !strings.Contains(e.ledger.Last().Get("Authorization"), "Bearer ") {
		t.Fatalf("valid token: %d %s", first.status, first.body)
	}
	if r := as(is.token(t, "k1", "alice", aud, soon), "k"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice's retry with a new token: %d, want the replay", r.status)
	}
	if r := as(is.token(t, "k1", "bob", aud, soon), "k"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("bob, same key: %d, want his own execution", r.status)
	}
	is.serve("k2")                      // rotation: k1 retired, k2 signs
	time.Sleep(1100 * time.Millisecond) // key sets are fetched at most once a second
	if r := as(is.token(t, "k2", "alice", aud, soon), "k"); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("alice with a token of the rotated key: %d %s, want the replay", r.status, r.body)
	}
	for name, tok := range map[string]string{
		"expired":        is.token(t, "k2", "alice", aud, time.Now().Add(-time.Hour)),
		"wrong audience": is.token(t, "k2", "alice", []string{"other"}, soon),
		"forged":         is.token(t, "k2", "alice", aud, soon)[:40] + "x" + is.token(t, "k2", "alice", aud, soon)[41:],
		"garbage":        "not-a-jwt",
	} {
		if r := as(tok, "k9"); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "token-invalid") {
			t.Errorf("%s token: %d %s, want 401 token-invalid", name, r.status, r.body)
		}
	}
	if r := e.do(req{key: "k9", body: `{}`}); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "identity-missing") {
		t.Errorf("no token: %d %s, want 401 identity-missing", r.status, r.body)
	}
	if n := e.ledger.Total(); n != 2 {
		t.Errorf("upstream executed %d times, want 2", n)
	}
}
