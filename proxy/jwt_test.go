package proxy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/idemproxy/idemproxy/internal/poll"
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
		c.Identity.Source = proxy.SourceJWT
		c.Identity.JWT = proxy.JWTConfig{JWKSURL: jwks.URL, Issuer: "https://issuer.example", Audience: []string{"payments"}}
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

// tokenWith signs claims with kid's key under alg's header, with typ.
func (is *issuer) tokenWith(t *testing.T, kid, typ string, claims jwt.Claims) string {
	is.mu.Lock()
	key := is.keys[kid]
	is.mu.Unlock()
	opts := (&jose.SignerOptions{}).WithHeader("kid", kid)
	if typ != "" {
		opts = opts.WithType(jose.ContentType(typ))
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// The low findings around JWT: a token without exp, a typ that is not a
// JWT and a key whose alg differs from the token's are refused; two
// Authorization headers are 400 identity-invalid and nothing is
// forwarded. Each was accepted before.
func TestJWTHardening(t *testing.T) {
	is := &issuer{}
	is.add(t, "k1")
	is.add(t, "k2")
	is.serve("k1", "k2")
	var mu sync.Mutex
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		var set jose.JSONWebKeySet
		set.Keys = append(set.Keys,
			jose.JSONWebKey{Key: &is.keys["k1"].PublicKey, KeyID: "k1", Algorithm: string(jose.ES256), Use: "sig"},
			jose.JSONWebKey{Key: &is.keys["k2"].PublicKey, KeyID: "k2", Algorithm: string(jose.ES384), Use: "sig"}) // k2 is declared ES384
		json.NewEncoder(w).Encode(set)
	}))
	defer jwks.Close()
	e := newEnv(t, created, func(c *setup) {
		c.Identity.Source = proxy.SourceJWT
		c.Identity.JWT = proxy.JWTConfig{JWKSURL: jwks.URL, Issuer: "https://issuer.example", Audience: []string{"payments"}}
	})
	good := jwt.Claims{Issuer: "https://issuer.example", Subject: "alice", Audience: jwt.Audience{"payments"}, Expiry: jwt.NewNumericDate(time.Now().Add(time.Hour))}
	noExp := good
	noExp.Expiry = nil
	for name, tok := range map[string]string{
		"no exp":        is.tokenWith(t, "k1", "JWT", noExp),
		"typ not a JWT": is.tokenWith(t, "k1", "application/jose+json", good),
		"alg mismatch":  is.tokenWith(t, "k2", "JWT", good),
	} {
		r := e.do(req{key: "k-" + name, body: `{}`, header: map[string]string{"Authorization": "Bearer " + tok}})
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "token-invalid") {
			t.Errorf("%s: %d %s, want 401 token-invalid", name, r.status, r.body)
		}
	}
	if r := e.do(req{key: "ok", body: `{}`, header: map[string]string{"Authorization": "Bearer " + is.tokenWith(t, "k1", "JWT", good)}}); r.status != http.StatusCreated {
		t.Fatalf("a good token: %d %s", r.status, r.body)
	}
	// Two Authorization headers: the upstream could read the other one.
	hr, _ := http.NewRequest(http.MethodPost, e.front.URL+"/payments", strings.NewReader(`{}`))
	hr.Header.Set("Idempotency-Key", "twice")
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Add("Authorization", "Bearer "+is.tokenWith(t, "k1", "JWT", good))
	hr.Header.Add("Authorization", "Bearer forged")
	res, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("two Authorization headers: %d, want 400 identity-invalid", res.StatusCode)
	}
	if n := e.ledger.Total(); n != 1 {
		t.Errorf("upstream executed %d times, want 1 (the good token only)", n)
	}
}

// The key set is fetched in the background, never under a request's
// context or a lock verifications take: while the issuer is stuck serving
// a refetch (an unknown key id asked for it), a token whose key is cached
// is verified and served; and requests naming unknown key ids that hang up
// at once do not starve the fetch a rotated key needs (JWKS starvation,
// issue 24 finding 1, and the lock, finding 2).
func TestJWKSFetchIsBackground(t *testing.T) {
	t.Parallel() // on its own store and servers; mostly waiting: runs beside the others (go test ./... time)
	is := &issuer{}
	is.add(t, "k1")
	is.add(t, "k2")
	is.serve("k1")
	release := make(chan struct{})
	var fetches sync.WaitGroup
	var stuck bool
	var smu sync.Mutex
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		smu.Lock()
		hold := stuck
		smu.Unlock()
		if hold {
			fetches.Add(1)
			defer fetches.Done()
			<-release
		}
		time.Sleep(50 * time.Millisecond) // a remote issuer
		is.ServeHTTP(w, r)
	}))
	defer jwks.Close()
	defer close(release)
	e := newEnv(t, created, func(c *setup) {
		c.Identity.Source = proxy.SourceJWT
		c.Identity.JWT = proxy.JWTConfig{JWKSURL: jwks.URL, Issuer: "https://issuer.example", Audience: []string{"payments"}}
	})
	aud, soon := []string{"payments"}, time.Now().Add(time.Hour)
	as := func(ctx context.Context, tok, key string) (resp, error) {
		return e.try(ctx, req{key: key, body: `{}`, header: map[string]string{"Authorization": "Bearer " + tok}})
	}
	if r, _ := as(context.Background(), is.token(t, "k1", "alice", aud, soon), "warm"); r.status != http.StatusCreated {
		t.Fatalf("k1: %d %s", r.status, r.body)
	}

	// The issuer gets stuck; an unknown key id starts a refetch that hangs.
	smu.Lock()
	stuck = true
	smu.Unlock()
	time.Sleep(1100 * time.Millisecond) // past the refetch rate limit
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	as(ctx, is.token(t, "k2", "mallory", aud, soon), "unknown") // k2 is not served yet: unknown
	cancel()
	done := make(chan resp, 1)
	go func() {
		r, _ := as(context.Background(), is.token(t, "k1", "alice", aud, soon), "cached")
		done <- r
	}()
	select {
	case r := <-done:
		if r.status != http.StatusCreated {
			t.Fatalf("cached key while the issuer is stuck: %d %s", r.status, r.body)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("a token with a cached key waited for the stuck key-set fetch")
	}
	smu.Lock()
	stuck = false
	smu.Unlock()
	release <- struct{}{} // the stuck fetch ends (it gets k1 only)
	fetches.Wait()
	time.Sleep(100 * time.Millisecond) // its answer is read before k2 is served

	// Rotation under attack: k2 signs now, and a flood of unknown key ids
	// whose clients hang up at once runs alongside.
	is.serve("k1", "k2")
	is.add(t, "k3") // never served: the attackers' key ids are unknown
	forged := is.token(t, "k3", "mallory", aud, soon)
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
				// No body: the server then watches the connection, and the
				// request's context ends the moment the client hangs up.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				e.try(ctx, req{key: "attack", header: map[string]string{"Authorization": "Bearer " + forged}})
				cancel()
			}
		})
	}
	time.Sleep(1100 * time.Millisecond) // the last fetch (without k2) is a second old
	ok := 0
	for i := range 10 {
		time.Sleep(300 * time.Millisecond)
		if r, _ := as(context.Background(), is.token(t, "k2", "alice", aud, soon), fmt.Sprintf("rotated-%d", i)); r.status == http.StatusCreated {
			ok++
		}
	}
	close(stop)
	attackers.Wait()
	if ok != 10 {
		t.Errorf("%d of 10 valid requests with the rotated key succeeded under a flood of unknown key ids, want 10", ok)
	}
}

// TestJWKSEmptyAnswerKeepsTheKeys (issue 31): an issuer answering 200 with
// null, {}, {"keys":[]} or only keys that cannot verify a signature is a
// failed fetch: the last good key set stays, and valid tokens keep
// verifying. Before, such an answer replaced the cached keys, and since
// anyone can trigger the fetch with an unknown kid, every valid token then
// got 401.
func TestJWKSEmptyAnswerKeepsTheKeys(t *testing.T) {
	t.Parallel() // on its own store and servers; mostly waiting: runs beside the others (go test ./... time)
	for _, body := range []string{`null`, `{}`, `{"keys":[]}`, `{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"hmac"}]}`} {
		t.Run(body, func(t *testing.T) {
			is := &issuer{}
			is.add(t, "k1")
			is.serve("k1")
			var broken sync.Mutex
			bad := false
			jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				broken.Lock()
				b := bad
				broken.Unlock()
				if b {
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprint(w, body)
					return
				}
				is.ServeHTTP(w, r)
			}))
			defer jwks.Close()
			e := newEnv(t, created, func(c *setup) {
				c.Identity.Source = proxy.SourceJWT
				c.Identity.JWT = proxy.JWTConfig{JWKSURL: jwks.URL, Issuer: "https://issuer.example", Audience: []string{"payments"}}
			})
			aud, soon := []string{"payments"}, time.Now().Add(time.Hour)
			as := func(tok, key string) resp {
				return e.do(req{key: key, body: `{}`, header: map[string]string{"Authorization": "Bearer " + tok}})
			}
			// The key set's first fetch may still be on its way (or have
			// timed out on a loaded machine): wait until it verifies.
			poll.Until(t, "a valid token verifies", func() bool {
				return as(is.token(t, "k1", "alice", aud, soon), "before").status == http.StatusCreated
			})
			broken.Lock()
			bad = true
			broken.Unlock()
			time.Sleep(1100 * time.Millisecond) // past the refetch rate limit
			is.add(t, "unknown")
			if r := as(is.token(t, "unknown", "mallory", aud, soon), "trigger"); r.status != http.StatusUnauthorized {
				t.Fatalf("an unknown kid: %d %s, want 401", r.status, r.body)
			}
			if r := as(is.token(t, "k1", "alice", aud, soon), "after"); r.status != http.StatusCreated {
				t.Fatalf("a valid token after the issuer answered %s: %d %s, want 201 (the last good key set)", body, r.status, r.body)
			}
		})
	}
}
