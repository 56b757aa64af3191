package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Webhook receivers. Providers deliver webhooks at least once: Stripe,
// GitHub, Shopify and every Standard Webhooks sender retry on a timeout or
// a 5xx, and a legacy handler then books the payment twice. On a route
// with a webhook, a delivery is verified by the provider's signature over
// the raw body before anything is claimed or forwarded (a forged first
// delivery cannot poison the id: it is refused, and the real one executes
// later); the principal is the provider, so any peer may deliver once
// signed; the key is the provider's own delivery id; the fingerprint
// covers the body, never the signature headers, which providers renew on
// every retry. A redelivery then gets the stored answer.

// Webhook providers.
const (
	WebhookStripe   = "stripe"
	WebhookGitHub   = "github"
	WebhookShopify  = "shopify"
	WebhookStandard = "standard"
)

// Webhook is a route's webhook receiver.
type Webhook struct {
	// Provider is WebhookStripe, WebhookGitHub, WebhookShopify or
	// WebhookStandard.
	Provider string
	// Secrets are the signing secrets as their files hold them; any one
	// verifies (rotation).
	Secrets [][]byte
	// Tolerance bounds how far a signed timestamp (stripe, standard) may
	// be from now; zero: 5 minutes.
	Tolerance time.Duration
}

// Results of a delivery, the values of idemproxy_webhook_deliveries_total's
// result label.
const (
	webhookExecuted   = "executed"          // forwarded as the first delivery
	webhookReplayed   = "replayed"          // a redelivery, answered from the record
	webhookInProgress = "in_progress"       // a redelivery while the first still runs
	webhookSigInvalid = "signature_invalid" // missing, wrong or stale signature
	webhookRefused    = "refused"           // anything else refused (no id, too large, store down)
)

var (
	errSigMissing = errors.New("no signature header")
	errSigWrong   = errors.New("no signature matches any of the route's secrets")
	errSigStale   = errors.New("the signed timestamp is outside the route's tolerance")
)

// principal is the principal of every delivery: the provider.
func (wh *Webhook) principal() string { return "webhook:" + wh.Provider }

// verify checks the delivery's signature over its raw body.
func (wh *Webhook) verify(h http.Header, body []byte, now time.Time) error {
	tolerance := wh.Tolerance
	if tolerance <= 0 {
		tolerance = 5 * time.Minute
	}
	fresh := func(ts string) error {
		sec, err := strconv.ParseInt(strings.TrimSpace(ts), 10, 64)
		if err != nil {
			return fmt.Errorf("the signed timestamp %q is not a Unix time", ts)
		}
		if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
			return errSigStale
		}
		return nil
	}
	switch wh.Provider {
	case WebhookStripe:
		// Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(t.body)>[,v1=...]
		v := h.Get("Stripe-Signature")
		if v == "" {
			return errSigMissing
		}
		var ts string
		var sigs [][]byte
		for part := range strings.SplitSeq(v, ",") {
			k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
			switch k {
			case "t":
				ts = val
			case "v1":
				if b, err := hex.DecodeString(val); err == nil {
					sigs = append(sigs, b)
				}
			}
		}
		if ts == "" || len(sigs) == 0 {
			return errSigMissing
		}
		if !wh.anyMAC(sigs, func(secret []byte) []byte { return mac(secret, []byte(ts+"."), body) }) {
			return errSigWrong
		}
		return fresh(ts)
	case WebhookGitHub:
		// X-Hub-Signature-256: sha256=<hex HMAC-SHA256(body)>
		v, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256=")
		if !ok {
			return errSigMissing
		}
		sig, err := hex.DecodeString(v)
		if err != nil || !wh.anyMAC([][]byte{sig}, func(secret []byte) []byte { return mac(secret, body) }) {
			return errSigWrong
		}
		return nil
	case WebhookShopify:
		// X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(body)>
		v := header(h, "X-Shopify-Hmac-Sha256", "Shopify-Hmac-Sha256")
		if v == "" {
			return errSigMissing
		}
		sig, err := base64.StdEncoding.DecodeString(v)
		if err != nil || !wh.anyMAC([][]byte{sig}, func(secret []byte) []byte { return mac(secret, body) }) {
			return errSigWrong
		}
		return nil
	case WebhookStandard:
		// webhook-signature: v1,<base64 HMAC-SHA256(id.timestamp.body)>
		// [ v1,...], keyed by the base64 secret after "whsec_".
		id, ts, v := standardHeaders(h)
		if id == "" || ts == "" || v == "" {
			return errSigMissing
		}
		var sigs [][]byte
		for part := range strings.FieldsSeq(v) {
			if b64, ok := strings.CutPrefix(part, "v1,"); ok {
				if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
					sigs = append(sigs, b)
				}
			}
		}
		if !wh.anyMAC(sigs, func(secret []byte) []byte {
			key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(string(secret), "whsec_"))
			if err != nil {
				return nil
			}
			return mac(key, []byte(id+"."+ts+"."), body)
		}) {
			return errSigWrong
		}
		return fresh(ts)
	}
	return fmt.Errorf("unknown webhook provider %q", wh.Provider)
}

// header is the first of names that h carries ("" when none): Shopify's
// current library sends its names without "X-".
func header(h http.Header, names ...string) string {
	for _, n := range names {
		if v := h.Get(n); v != "" {
			return v
		}
	}
	return ""
}

// standardHeaders are a Standard Webhooks delivery's id, timestamp and
// signature: the webhook-* names, or Svix's svix-* (its reference sender),
// never a mix of the two.
func standardHeaders(h http.Header) (id, ts, sig string) {
	if h.Get("Webhook-Id") != "" || h.Get("Webhook-Signature") != "" {
		return h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), h.Get("Webhook-Signature")
	}
	return h.Get("Svix-Id"), h.Get("Svix-Timestamp"), h.Get("Svix-Signature")
}

// anyMAC reports whether one of sigs is the MAC sign computes under one
// of the route's secrets (compared in constant time).
func (wh *Webhook) anyMAC(sigs [][]byte, sign func(secret []byte) []byte) bool {
	for _, secret := range wh.Secrets {
		want := sign(secret)
		if want == nil {
			continue
		}
		for _, s := range sigs {
			if hmac.Equal(s, want) {
				return true
			}
		}
	}
	return false
}

func mac(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// deliveryID is the provider's own id of the delivery, the idempotency
// key: Stripe's event id (the body's /id), GitHub's X-GitHub-Delivery,
// Shopify's X-Shopify-Webhook-Id, Standard Webhooks' webhook-id.
func (wh *Webhook) deliveryID(h http.Header, body []byte) (string, error) {
	var id, where string
	switch wh.Provider {
	case WebhookStripe:
		where = "the event's id (/id of the body)"
		v, found, err := bodyKey(body, []string{"id"})
		if err != nil {
			return "", err
		}
		if found {
			id = v
		}
	case WebhookGitHub:
		where, id = "X-GitHub-Delivery", h.Get("X-GitHub-Delivery")
	case WebhookShopify:
		where, id = "X-Shopify-Webhook-Id", header(h, "X-Shopify-Webhook-Id", "Shopify-Webhook-Id")
	case WebhookStandard:
		where = "webhook-id"
		id, _, _ = standardHeaders(h)
	}
	switch {
	case id == "":
		return "", fmt.Errorf("%w: no %s", errKeyMissing, where)
	case len(id) > MaxKeyLen:
		return "", errKeyTooLong
	case !visibleASCII(id):
		return "", errKeyChars
	}
	return id, nil
}

// serveWebhook is serve for a webhook route: the body, the signature, the
// delivery id, then the claim as for any protected request.
func (x *exchange) serveWebhook() {
	wh := x.rt.settings.Webhook
	if x.r.URL.Path != x.path {
		x.answer(outcomeRejected, probPathNotCanonical.with("send it to "+x.path+", the path this route protects"))
		return
	}
	x.principal = wh.principal()
	body, ok := x.readBody()
	if !ok {
		return
	}
	if err := wh.verify(x.r.Header, body, time.Now()); err != nil {
		x.webhookResult = webhookSigInvalid
		x.answer(outcomeRejected, probSignatureInvalid.with(err.Error()+"; nothing was claimed or forwarded"))
		return
	}
	key, err := wh.deliveryID(x.r.Header, body)
	switch {
	case errors.Is(err, errKeyMissing):
		x.answer(outcomeRejected, probKeyMissing.with(err.Error()))
		return
	case err != nil:
		x.answer(outcomeRejected, probKeyMalformed.with(err.Error()))
		return
	}
	x.r.Header.Set(x.rt.settings.KeyHeader, key) // the upstream can dedupe on it too
	fp := x.rt.fp.sum(x.r.Method, x.path, x.r.URL.RawQuery, x.r.Header, body)
	x.hashedKey = x.h.store.Key(x.principal, x.rt.scope, key)
	x.ownOrAnswer(x.newClaim(fp), body)
}

// webhookOutcome is a delivery's result label, from its outcome.
func (x *exchange) webhookOutcome() string {
	if x.webhookResult != "" {
		return x.webhookResult
	}
	switch x.outcome {
	case outcomeStored, outcomeClaimed, outcomeReleased, outcomeUpstreamTimeout, outcomeStoreError, outcomeFenceLost:
		return webhookExecuted
	case outcomeReplayed:
		return webhookReplayed
	case outcomeConflict:
		return webhookInProgress
	}
	return webhookRefused
}
