package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// JWTConfig verifies bearer tokens as the source of principals.
type JWTConfig struct {
	// JWKSURL serves the issuer's signing keys (a JSON Web Key Set).
	JWKSURL string
	// Issuer and Audience are what tokens must name (iss, and one of aud).
	Issuer   string
	Audience []string
	// Claim holds the principal; "" uses sub.
	Claim string
}

// jwtAlgorithms are the signatures accepted: asymmetric only, so that a
// key set can never be used to forge a token.
var jwtAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.ES256, jose.ES384, jose.EdDSA}

// jwksRefresh is the least time between two fetches of the key set: an
// unknown key id (a rotation) fetches it again, but a flood of forged key
// ids costs the issuer one fetch a second at most.
const jwksRefresh = time.Second

// jwtVerifier turns a bearer token into a principal.
type jwtVerifier struct {
	cfg    JWTConfig
	client *http.Client

	mu      sync.Mutex // guards keys and fetched
	keys    jose.JSONWebKeySet
	fetched time.Time
}

var errNoToken = errors.New("no bearer token")

// principal verifies the bearer token in authorization and returns its
// principal claim.
func (v *jwtVerifier) principal(ctx context.Context, authorization string) (string, error) {
	raw, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || raw == "" {
		return "", errNoToken
	}
	tok, err := jwt.ParseSigned(strings.TrimSpace(raw), jwtAlgorithms)
	if err != nil || len(tok.Headers) != 1 {
		return "", fmt.Errorf("not a signed JWT")
	}
	key, err := v.key(ctx, tok.Headers[0].KeyID)
	if err != nil {
		return "", err
	}
	var std jwt.Claims
	custom := map[string]any{}
	if err := tok.Claims(key, &std, &custom); err != nil {
		return "", fmt.Errorf("signature does not verify")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: v.cfg.Issuer, AnyAudience: v.cfg.Audience, Time: time.Now()}, 30*time.Second); err != nil {
		return "", err
	}
	if v.cfg.Claim == "" || v.cfg.Claim == "sub" {
		if std.Subject == "" {
			return "", fmt.Errorf("no sub claim")
		}
		return std.Subject, nil
	}
	p, ok := custom[v.cfg.Claim].(string)
	if !ok || p == "" {
		return "", fmt.Errorf("no %s claim", v.cfg.Claim)
	}
	return p, nil
}

// key returns the verification key kid names, fetching the key set when
// it is not known yet (rotation), at most once per jwksRefresh.
func (v *jwtVerifier) key(ctx context.Context, kid string) (any, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ks := v.keys.Key(kid); len(ks) > 0 {
		return ks[0].Public().Key, nil
	}
	if time.Since(v.fetched) < jwksRefresh && !v.fetched.IsZero() {
		return nil, fmt.Errorf("unknown key id %q", kid)
	}
	v.fetched = time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	resp, err := v.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the key set: %w", err)
	}
	defer resp.Body.Close()
	var set jose.JSONWebKeySet
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the key set: %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&set); err != nil {
		return nil, fmt.Errorf("fetch the key set: %w", err)
	}
	v.keys = set
	if ks := v.keys.Key(kid); len(ks) > 0 {
		return ks[0].Public().Key, nil
	}
	return nil, fmt.Errorf("unknown key id %q", kid)
}
