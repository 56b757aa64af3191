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
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// JWTConfig verifies bearer tokens as the source of principals.
type JWTConfig struct {
	// JWKSURL serves the issuer's signing keys (a JSON Web Key Set).
	JWKSURL string
	// Issuer is the iss every token must name.
	Issuer string
	// Audience lists the aud values accepted; a token must name one.
	Audience []string
	// Claim holds the principal; "" uses sub.
	Claim string
	// Leeway is how far past exp (and before nbf) a token is accepted;
	// zero uses defaultJWTLeeway.
	Leeway time.Duration
}

// defaultJWTLeeway is JWTConfig.Leeway's default.
const defaultJWTLeeway = 30 * time.Second

// jwtAlgorithms are the signatures accepted: asymmetric only, so that a
// key set can never be used to forge a token.
var jwtAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.ES256, jose.ES384, jose.EdDSA}

// Key set fetches. The set is fetched at start and again when a token names
// a key it does not list (a rotation), in the background: never under a
// request's context (a client that hangs up cannot cancel it) and never
// under a lock a verification takes (a slow issuer delays nobody whose
// key is known). One fetch at a time; after a successful fetch the next
// waits jwksRefresh, so a flood of forged key ids costs the issuer one
// fetch a second at most, and after a failed one jwksRetry.
const (
	jwksRefresh      = time.Second
	jwksRetry        = 250 * time.Millisecond
	jwksFetchTimeout = 5 * time.Second
)

var (
	errNoToken       = errors.New("no bearer token")
	errTokenTwice    = errors.New("the Authorization header appears more than once")
	errUnknownKeyID  = errors.New("unknown key id")
	errKeySetMissing = errors.New("the issuer's key set could not be fetched")
)

// jwtSource turns a bearer token into a principal.
type jwtSource struct {
	cfg    JWTConfig
	client *http.Client
	// keys is the last key set fetched, read without a lock.
	keys atomic.Pointer[jose.JSONWebKeySet]

	// mu guards fetching, done, lastOK and lastTry.
	mu       sync.Mutex
	fetching bool
	// done is closed when the fetch in flight ends.
	done    chan struct{}
	lastOK  time.Time
	lastTry time.Time
}

func newJWTSource(cfg JWTConfig, client *http.Client) *jwtSource {
	if cfg.Leeway <= 0 {
		cfg.Leeway = defaultJWTLeeway
	}
	s := &jwtSource{cfg: cfg, client: client}
	s.keys.Store(&jose.JSONWebKeySet{})
	s.refresh() // at start: the first requests need not wait
	return s
}

func (s *jwtSource) missing() string {
	return "an authenticated principal: send Authorization: Bearer <token>"
}

// principal verifies the bearer token and returns its principal claim.
// Only protected requests are verified: a signature check is real CPU.
func (s *jwtSource) principal(ctx context.Context, r *http.Request, _ bool) (string, error) {
	values := r.Header.Values("Authorization")
	if len(values) > 1 {
		return "", errTokenTwice
	}
	raw, ok := "", false
	if len(values) == 1 {
		raw, ok = strings.CutPrefix(values[0], "Bearer ")
	}
	if !ok || strings.TrimSpace(raw) == "" {
		return "", errNoToken
	}
	tok, err := jwt.ParseSigned(strings.TrimSpace(raw), jwtAlgorithms)
	if err != nil || len(tok.Headers) != 1 {
		return "", errors.New("not a signed JWT")
	}
	h := tok.Headers[0]
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != "" && !validTyp(typ) {
		return "", fmt.Errorf("typ %q is not a JWT", typ)
	}
	key, err := s.key(ctx, h.KeyID)
	if err != nil {
		return "", err
	}
	if key.Algorithm != "" && key.Algorithm != h.Algorithm {
		return "", fmt.Errorf("alg %s does not match the key's %s", h.Algorithm, key.Algorithm)
	}
	var std jwt.Claims
	custom := map[string]any{}
	if err := tok.Claims(key.Public().Key, &std, &custom); err != nil {
		return "", errors.New("signature does not verify")
	}
	if std.Expiry == nil {
		return "", errors.New("no exp claim: a token must expire")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: s.cfg.Issuer, AnyAudience: s.cfg.Audience, Time: time.Now()}, s.cfg.Leeway); err != nil {
		return "", err
	}
	if s.cfg.Claim == "" || s.cfg.Claim == "sub" {
		if std.Subject == "" {
			return "", errors.New("no sub claim")
		}
		return std.Subject, nil
	}
	p, ok := custom[s.cfg.Claim].(string)
	if !ok || p == "" {
		return "", fmt.Errorf("no %s claim", s.cfg.Claim)
	}
	return p, nil
}

// validTyp accepts the media types of a JWT (RFC 7519, RFC 9068).
func validTyp(typ string) bool {
	t := strings.ToLower(strings.TrimPrefix(strings.ToLower(typ), "application/"))
	return t == "jwt" || t == "at+jwt"
}

// key returns the key kid names. A kid the set does not list asks for a
// fetch (when one may start) and waits for the fetch in flight, or until
// ctx ends: the fetch goes on for the next request either way.
func (s *jwtSource) key(ctx context.Context, kid string) (jose.JSONWebKey, error) {
	if ks := s.keys.Load().Key(kid); len(ks) > 0 {
		return ks[0], nil
	}
	done := s.refresh()
	if done == nil {
		return jose.JSONWebKey{}, fmt.Errorf("%w %q", errUnknownKeyID, kid)
	}
	select {
	case <-done:
	case <-ctx.Done():
		return jose.JSONWebKey{}, ctx.Err()
	}
	if ks := s.keys.Load().Key(kid); len(ks) > 0 {
		return ks[0], nil
	}
	if len(s.keys.Load().Keys) == 0 {
		return jose.JSONWebKey{}, errKeySetMissing
	}
	return jose.JSONWebKey{}, fmt.Errorf("%w %q", errUnknownKeyID, kid)
}

// refresh starts a fetch of the key set unless one is running, or one
// succeeded less than jwksRefresh ago (failed, jwksRetry). It returns the
// channel closed when the fetch in flight ends, or nil when none runs.
func (s *jwtSource) refresh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fetching {
		return s.done
	}
	now := time.Now()
	if !s.lastOK.IsZero() && now.Sub(s.lastOK) < jwksRefresh || now.Sub(s.lastTry) < jwksRetry {
		return nil
	}
	s.fetching, s.done, s.lastTry = true, make(chan struct{}), now
	go s.fetch(s.done)
	return s.done
}

// fetch reads the key set, under a context of its own.
func (s *jwtSource) fetch(done chan struct{}) {
	set, err := s.get()
	s.mu.Lock()
	if err == nil {
		s.keys.Store(set)
		s.lastOK = time.Now() // the rate limit counts from a fetch that worked
	}
	s.fetching = false
	s.mu.Unlock()
	close(done)
}

func (s *jwtSource) get() (*jose.JSONWebKeySet, error) {
	ctx, cancel := context.WithTimeout(context.Background(), jwksFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the key set: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the key set: %s", resp.Status)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&set); err != nil {
		return nil, fmt.Errorf("fetch the key set: %w", err)
	}
	// A 200 with null, {} or no key that can verify a signature is a
	// failed fetch, not an empty set: replacing the cached keys with it
	// would answer every valid token 401, and anyone can make the fetch
	// happen by naming an unknown kid. The last good set stays.
	usable := 0
	for _, k := range set.Keys {
		if k.Valid() && k.IsPublic() && (k.Use == "" || k.Use == "sig") {
			usable++
		}
	}
	if usable == 0 {
		return nil, fmt.Errorf("fetch the key set: %w", errKeySetEmpty)
	}
	return &set, nil
}

// errKeySetEmpty is a key set without a public signing key.
var errKeySetEmpty = errors.New("the key set has no public signing key")
