package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// keyInfo is what GET /v1/keys answers about one idempotency key: never
// the raw key or principal (the caller sent them), and the stored body
// only when asked for.
type keyInfo struct {
	// StoreKey is the hashed key, as the logs name it, in either store.
	StoreKey string `json:"store_key"`
	// RedisKey is StoreKey under its old name, kept for one release
	// (v0.8.0) for scripts that read it; removed in v0.9.0.
	RedisKey    string     `json:"redis_key"`
	State       string     `json:"state"` // absent, in_progress, completed, streamed
	Created     *time.Time `json:"created,omitempty"`
	Completed   *time.Time `json:"completed,omitempty"`
	Status      int        `json:"status,omitempty"`
	Fingerprint string     `json:"fingerprint,omitempty"`
	RequestID   string     `json:"original_request_id,omitempty"`
	// LeftSeconds is what is left of the lease (in progress) or of the
	// retention (completed).
	LeftSeconds float64 `json:"left_seconds,omitempty"`
	Orphaned    bool    `json:"orphaned,omitempty"`
	BodyOmitted bool    `json:"body_omitted,omitempty"`
	Body        *string `json:"body,omitempty"`
	// Stream is a streamed answer's progress (state streamed).
	Stream *streamInfo `json:"stream,omitempty"`
}

// streamInfo is how far a streamed answer got: how it ended so far
// (running, ended, aborted, too_large) and the bytes stored.
type streamInfo struct {
	End   string `json:"end"`
	Bytes int    `json:"bytes"`
}

// keysAPI serves /v1/keys on the admin port: look a key up, or clear it,
// for an operator answering "my retry keeps getting 409". Every call needs
// the bearer token and is logged as an audit line.
type keysAPI struct {
	// routes finds a route's key scope in the routes serving now.
	routes interface {
		RouteScope(name string) (string, bool)
		RouteNames() []string
		ReconcileKey(ctx context.Context, route, principal, key string) (result string, status int, body []byte, err error)
	}
	store claim.Backend
	log   *slog.Logger
	token []byte
}

// bearerOK reports whether r carries token as its bearer token; a nil
// token admits nobody.
func bearerOK(r *http.Request, token []byte) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	// Digests compared, not the tokens: ConstantTimeCompare returns at
	// once when the lengths differ, which tells the token's length.
	gotSum, wantSum := sha256.Sum256([]byte(got)), sha256.Sum256(token)
	return ok && token != nil && subtle.ConstantTimeCompare(gotSum[:], wantSum[:]) == 1
}

// principalDigest names principal in an audit line: keyed by the admin
// token (a subkey of it), so that a line's reader cannot confirm a guessed
// principal, while lines about one principal still match each other.
func principalDigest(token []byte, principal string) string {
	sub := hmac.New(sha256.New, token)
	sub.Write([]byte("idemproxy audit principal"))
	mac := hmac.New(sha256.New, sub.Sum(nil))
	mac.Write([]byte(principal))
	return hex.EncodeToString(mac.Sum(nil)[:8])
}

// audit logs the call c answered: every call is audited; a read that
// changed nothing is routine (INFO), a delete or a reconcile is not
// (WARN).
func (c *keyCall) audit(r *http.Request, routeName, principal string) {
	level := slog.LevelWarn
	if r.Method == http.MethodGet {
		level = slog.LevelInfo
	}
	c.log.Log(context.Background(), level, "admin key API", "method", r.Method, "route", routeName, "key", c.redisKey,
		"principal_hash", principalDigest(c.token, principal), "state", c.recState, "body_read", c.bodyRead,
		"force", c.q.Get("force") == "true", "result", c.result, "remote", r.RemoteAddr)
}

func (a keysAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !bearerOK(r, a.token) {
		a.log.Warn("admin key API: refused, bad or missing token", "method", r.Method, "remote", r.RemoteAddr)
		msg := "a bearer token is required: Authorization: Bearer <the content of admin.token_file>"
		if r.Header.Get("Authorization") != "" {
			msg = "the bearer token was refused: it is not the content of this sidecar's admin.token_file"
		}
		http.Error(w, msg, http.StatusUnauthorized)
		return
	}
	q := r.URL.Query()
	routeName, principal, key := q.Get("route"), q.Get("principal"), q.Get("key")
	// The routes serving now: a route added or changed by a reload is
	// found as the proxy finds it.
	scope, ok := a.routes.RouteScope(routeName)
	var missing []string
	switch {
	case routeName == "":
		missing = append(missing, "route")
	case !ok:
		http.Error(w, fmt.Sprintf("route %q is not configured; the routes serving now: %s", routeName, strings.Join(a.routes.RouteNames(), ", ")), http.StatusBadRequest)
		return
	}
	if principal == "" {
		missing = append(missing, "principal")
	}
	if key == "" {
		missing = append(missing, "key")
	}
	if len(missing) > 0 {
		http.Error(w, strings.Join(missing, ", ")+" required (route: a configured route's name; principal and key as the client's request carries them)", http.StatusBadRequest)
		return
	}
	c := &keyCall{keysAPI: a, w: w, q: q, redisKey: a.store.Codec().Key(principal, scope, key)}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	defer c.audit(r, routeName, principal)
	switch r.Method {
	case http.MethodGet:
		c.get(ctx)
	case http.MethodDelete:
		c.delete(ctx)
	case http.MethodPost:
		if q.Get("action") != "reconcile" {
			c.fail(http.StatusBadRequest, "refused: no action", "POST needs action=reconcile (ask the upstream now about a key left outcome-unknown or held by a vanished owner)")
			return
		}
		c.reconcile(r.Context(), routeName, principal, key)
	default:
		c.fail(http.StatusMethodNotAllowed, "refused: method", "GET, DELETE or POST action=reconcile")
	}
}

// keyCall is one call of the key API, and what its audit line says.
type keyCall struct {
	keysAPI
	w        http.ResponseWriter
	q        url.Values
	redisKey string
	// result, recState and bodyRead are audited.
	result, recState string
	bodyRead         bool
}

// fail answers status with msg, audited as result.
func (c *keyCall) fail(status int, result, msg string) {
	c.result = result
	http.Error(c.w, msg, status)
}

// get answers what is stored under the key (with body=true, the stored
// body too).
func (c *keyCall) get(ctx context.Context) {
	rec, left, err := c.store.Get(ctx, c.redisKey)
	if err != nil {
		c.fail(http.StatusServiceUnavailable, err.Error(), err.Error())
		return
	}
	info := keyInfo{StoreKey: c.redisKey, RedisKey: c.redisKey, State: "absent"}
	if rec != nil {
		info.State, info.Status, info.RequestID = rec.State.String(), rec.Status, rec.RequestID
		info.Fingerprint = hex.EncodeToString(rec.Fingerprint[:])
		info.LeftSeconds, info.Orphaned, info.BodyOmitted = left.Seconds(), rec.Orphaned(left), rec.BodyOmitted
		if !rec.Created.IsZero() {
			info.Created = &rec.Created
		}
		if !rec.Completed.IsZero() {
			info.Completed = &rec.Completed
		}
		if rec.State == claim.Streamed {
			info.Stream = &streamInfo{End: rec.StreamEnd.String(), Bytes: len(rec.Body)}
			if rec.StreamEnd == claim.StreamRunning && !rec.AliveUntil.IsZero() && time.Until(rec.AliveUntil) < -time.Second {
				// By this sidecar's clock against Redis' (the lease is
				// Redis'): what a reader will find, give or take a second.
				info.Stream.End = "aborted (its owner's lease ran out)"
			}
		}
		if c.q.Get("body") == "true" && (rec.State == claim.Completed || rec.State == claim.Streamed) {
			n, err := rec.InflatedLen()
			if err == nil {
				err = rec.Inflate(make([]byte, 0, n))
			}
			if err != nil {
				c.fail(http.StatusInternalServerError, err.Error(), "the stored body cannot be read: "+err.Error())
				return
			}
			b := string(rec.Body)
			info.Body, c.bodyRead = &b, true
		}
	}
	c.result, c.recState = info.State, info.State
	c.w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(c.w).Encode(info)
}

// reconcileAnswer is what POST action=reconcile answers: what the lookup
// said and what a retry gets now.
type reconcileAnswer struct {
	StoreKey string `json:"store_key"`
	RedisKey string `json:"redis_key"` // StoreKey's old name, for one release
	Result   string `json:"result"`
	Status   int    `json:"status,omitempty"`
	Body     string `json:"body,omitempty"`
}

// reconcile asks the upstream now about the key, as a retry would
// (routes[].reconcile): nothing executes; an absent answer frees the key
// for the next retry. Bounded by the route's reconcile.timeout, not the
// API's 2s.
func (c *keyCall) reconcile(ctx context.Context, route, principal, key string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	result, status, body, err := c.routes.ReconcileKey(ctx, route, principal, key)
	if err != nil {
		c.fail(http.StatusConflict, err.Error(), err.Error())
		return
	}
	c.result = "reconcile: " + result
	c.w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(c.w).Encode(reconcileAnswer{StoreKey: c.redisKey, RedisKey: c.redisKey, Result: result, Status: status, Body: string(body)})
}

// delete forgets the key's record in the state asked for: a live claim
// only with force=true.
func (c *keyCall) delete(ctx context.Context) {
	want := c.q.Get("state")
	state := map[string]claim.State{"in_progress": claim.InProgress, "completed": claim.Completed, "streamed": claim.Streamed}[want]
	if state == 0 {
		c.fail(http.StatusBadRequest, "refused: no state", "state=in_progress (release a stuck claim), state=completed (forget a stored answer) or state=streamed (forget a streamed answer) is required")
		return
	}
	rec, left, err := c.store.Get(ctx, c.redisKey)
	if err != nil {
		c.fail(http.StatusServiceUnavailable, err.Error(), err.Error())
		return
	}
	if rec != nil {
		c.recState = rec.State.String()
	}
	if rec != nil && rec.State == claim.InProgress && state == claim.InProgress && left > 0 && c.q.Get("force") != "true" {
		// Its owner may still be forwarding: a retry after the delete
		// would execute beside it, and its answer be lost (fence_lost).
		c.fail(http.StatusConflict, "refused: claim live", fmt.Sprintf("the claim is live (its owner renews it; %s of lease left): a retry after a delete would execute beside it. Wait for the lease to lapse, or add force=true if its owner is gone", left.Round(time.Millisecond)))
		return
	}
	if rec != nil && rec.State == claim.Streamed && state == claim.Streamed && rec.StreamEnd == claim.StreamRunning &&
		time.Until(rec.AliveUntil) > 0 && c.q.Get("force") != "true" {
		// Its owner is still relaying it: the stream would end abnormally
		// for its readers, and a retry execute beside it.
		c.fail(http.StatusConflict, "refused: stream running", fmt.Sprintf("the stream is running (its owner's lease has %s left): a delete ends it for every reader and a retry would execute beside it. Wait for its end, or add force=true if its owner is gone", time.Until(rec.AliveUntil).Round(time.Millisecond)))
		return
	}
	status := http.StatusOK
	switch err := c.store.Forget(ctx, c.redisKey, state); {
	case errors.Is(err, claim.ErrStateChanged):
		c.result, status = "left alone: not "+want, http.StatusConflict
	case err != nil:
		c.result, status = err.Error(), http.StatusServiceUnavailable
	default:
		c.result = "deleted " + want
	}
	c.w.WriteHeader(status)
	fmt.Fprintln(c.w, c.result)
}

// runKeys is "idemproxy keys get|delete|reconcile": the key API from the
// command line, against a running sidecar's admin port.
func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const keysUsage = "usage: idemproxy keys get|delete|reconcile -route R -principal P -key K [-state in_progress|completed|streamed] [-body] [-admin URL] [-token-file F]"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprintln(stderr, keysUsage)
		return nil
	}
	if len(args) == 0 || (args[0] != "get" && args[0] != "delete" && args[0] != "reconcile") {
		return errors.New(keysUsage)
	}
	fs := flag.NewFlagSet("idemproxy keys "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", "http://127.0.0.1:9090", "the sidecar's admin address")
	tokenFile := fs.String("token-file", "", "file holding the admin bearer token (admin.token_file)")
	route := fs.String("route", "", "route name")
	principal := fs.String("principal", "", "principal")
	key := fs.String("key", "", "idempotency key")
	state := fs.String("state", "", "delete only: in_progress, completed or streamed")
	force := fs.Bool("force", false, "delete only: release a live in-progress claim or a running stream (its owner is gone)")
	body := fs.Bool("body", false, "get only: include the stored body")
	if help, err := parseFlags(fs, args[1:], "every value is a flag"); help || err != nil {
		return err
	}
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		return fmt.Errorf("-token-file: %w", err)
	}
	q := url.Values{"route": {*route}, "principal": {*principal}, "key": {*key}}
	method := http.MethodGet
	switch {
	case args[0] == "delete":
		method = http.MethodDelete
		q.Set("state", *state)
		if *force {
			q.Set("force", "true")
		}
	case args[0] == "reconcile":
		method = http.MethodPost
		q.Set("action", "reconcile")
	case *body:
		q.Set("body", "true")
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(*admin, "/")+"/v1/keys?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(stdout, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s", resp.Status)
	}
	return nil
}
