package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// Webhook providers: how each signs its deliveries and what keys them.
// Adding one is a constant, a row in providers and its test vectors
// (webhook_vectors_test.go); config/ accepts the names Providers lists.
const (
	WebhookStripe   = "stripe"
	WebhookGitHub   = "github"
	WebhookShopify  = "shopify"
	WebhookStandard = "standard"
)

// provider is one webhook provider's scheme.
type provider struct {
	// headers reads a delivery's signature headers: its signatures, and
	// the timestamp (checked for freshness by Webhook.headers) and id it
	// signs; errSigMissing or errSigWrong when they cannot verify.
	headers func(h http.Header) (signed, error)
	// sign is the MAC the provider computes over body under secret (a
	// secret as its file holds it); nil when the secret cannot be one.
	sign func(secret []byte, d signed, body []byte) []byte
	// key is the delivery's key from what is signed; errKeyMissing (or
	// a JSON error) when there is none.
	key func(d signed, body []byte) (string, error)
	// unsignedID, for a provider whose delivery id is not signed (and so
	// is not the key), reads it: the key v0.5.0 used, still forwarded.
	unsignedID func(h http.Header) string
	// event, for a provider keyed by the body's digest, reads what the
	// delivery is about (its event first), each header present once and
	// in the provider's grammar; errEventMalformed otherwise.
	event func(h http.Header) ([]string, error)
	// eventKeyed is how many of event's parts the key names (eventSum);
	// the rest are checked, never keyed: they are unsigned, and a part in
	// the key would let a captured body execute once per value invented
	// for it. Zero: all of them.
	eventKeyed int
	// wideKeyChange, when set, is the key change that dropped parts of
	// event from the key: the key it replaced (every part) is read for
	// one retention after it.
	wideKeyChange int
}

// Key changes of webhook routes, by the release that made them.
const (
	keysV06 = iota // v0.6.0: keyed by what is signed, scoped by route
	keysV07        // v0.7.0: a body's digest with the event it is about
	keysV09        // v0.9.0: the event's unsigned parts out of the key (Shopify's shop)
	keyChanges
)

// keyChangeMarkers name the store's markers (Store.Since) of when it first
// served a release with each key change.
var keyChangeMarkers = [keyChanges]string{keysV06: "webhook-keys-v0.6", keysV07: "webhook-keys-v0.7", keysV09: "webhook-keys-v0.9"}

// signed is what a delivery's headers say about its signature, read
// before its body.
type signed struct {
	// id and ts are the signed delivery id and timestamp, where the
	// provider signs them; sigs the signatures the headers carry.
	id, ts string
	sigs   [][]byte
	// event is what the delivery is about (unsigned), for a provider
	// keyed by the body's digest: part of its key (eventSum), since one
	// body can be delivered under several topics, each a delivery.
	event []string
}

// providers are the webhook providers, by name.
var providers = map[string]provider{
	// Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(t.body)>[,v1=...];
	// the key is the event id, /id of the signed body.
	WebhookStripe: {
		headers: func(h http.Header) (signed, error) {
			var d signed
			for part := range strings.SplitSeq(h.Get("Stripe-Signature"), ",") {
				k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
				switch k {
				case "t":
					d.ts = val
				case "v1":
					if b, err := hex.DecodeString(val); err == nil {
						d.sigs = append(d.sigs, b)
					}
				}
			}
			if d.ts == "" || len(d.sigs) == 0 {
				return d, errSigMissing
			}
			return d, nil
		},
		sign: func(secret []byte, d signed, body []byte) []byte { return mac(secret, []byte(d.ts+"."), body) },
		key: func(_ signed, body []byte) (string, error) {
			id, found, err := bodyKey(body, []string{"id"})
			if err == nil && !found {
				err = fmt.Errorf("%w: no event id (/id of the body)", errKeyMissing)
			}
			return id, err
		},
	},
	// X-Hub-Signature-256: sha256=<hex HMAC-SHA256(body)>; the delivery id
	// (X-GitHub-Delivery) is not signed.
	WebhookGitHub: {
		headers: func(h http.Header) (signed, error) {
			v, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256=")
			if !ok {
				return signed{}, errSigMissing
			}
			sig, err := hex.DecodeString(v)
			if err != nil {
				return signed{}, errSigWrong
			}
			return signed{sigs: [][]byte{sig}}, nil
		},
		sign:       bodyMAC,
		key:        eventSum,
		unsignedID: func(h http.Header) string { return h.Get("X-GitHub-Delivery") },
		event: func(h http.Header) ([]string, error) {
			ev, err := once(h, githubEvent, "X-GitHub-Event")
			return []string{ev}, err
		},
	},
	// X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(body)>, or the names
	// without X-, which Shopify's current library sends; the delivery id
	// (X-Shopify-Webhook-Id) is not signed.
	WebhookShopify: {
		headers: func(h http.Header) (signed, error) {
			v := header(h, "X-Shopify-Hmac-Sha256", "Shopify-Hmac-Sha256")
			if v == "" {
				return signed{}, errSigMissing
			}
			sig, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				return signed{}, errSigWrong
			}
			return signed{sigs: [][]byte{sig}}, nil
		},
		sign:       bodyMAC,
		key:        eventSum,
		unsignedID: func(h http.Header) string { return header(h, "X-Shopify-Webhook-Id", "Shopify-Webhook-Id") },
		event:      shopifyEvent,
		// The shop's domain is checked (present once, well formed) but is
		// unsigned: keyed, a captured delivery executed once per invented
		// domain (issue 78). v0.8.0's key named it: read for one retention.
		eventKeyed:    1,
		wideKeyChange: keysV09,
	},
	// webhook-signature: v1,<base64 HMAC-SHA256(id.timestamp.body)>
	// [ v1,...], keyed by the base64 secret after "whsec_"; Svix, the
	// reference sender, names its headers svix-*. The key is the signed id.
	WebhookStandard: {
		headers: func(h http.Header) (signed, error) {
			var d signed
			var v string
			d.id, d.ts, v = standardHeaders(h)
			if d.id == "" || d.ts == "" || v == "" {
				return d, errSigMissing
			}
			for part := range strings.FieldsSeq(v) {
				if b64, ok := strings.CutPrefix(part, "v1,"); ok {
					if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
						d.sigs = append(d.sigs, b)
					}
				}
			}
			return d, nil
		},
		sign: func(secret []byte, d signed, body []byte) []byte {
			key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(string(secret), "whsec_"))
			if err != nil {
				return nil
			}
			return mac(key, []byte(d.id+"."+d.ts+"."), body)
		},
		key: func(d signed, _ []byte) (string, error) { return d.id, nil },
	},
}

// Providers are the webhook providers' names, sorted.
func Providers() []string { return slices.Sorted(maps.Keys(providers)) }

// bodyMAC is the HMAC-SHA256 of the body alone.
func bodyMAC(secret []byte, _ signed, body []byte) []byte { return mac(secret, body) }

// bodySum is what v0.6.0 keyed a delivery by whose provider signs only
// the body: "sha256:" and the body's hex SHA-256 (the provider's
// redeliveries resend it).
func bodySum(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// eventSum keys a delivery whose provider signs only the body by the
// body's digest and what the delivery is about (d.event, as far as its
// provider keys it: GitHub's event, Shopify's topic): bodySum, then ":"
// and the first 128 bits of the hex SHA-256 of the event's parts, each
// length-prefixed. Two topics with byte-identical bodies are two
// deliveries. The event headers are not signed, so a captured body
// resent under another listed event executes once per event
// (docs/security.md).
func eventSum(d signed, body []byte) (string, error) {
	m := sha256.New()
	for _, part := range d.event {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		m.Write(n[:])
		m.Write([]byte(part))
	}
	return bodySum(body) + ":" + hex.EncodeToString(m.Sum(nil)[:16]), nil
}

func mac(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// shopifyEvent is what a Shopify delivery is about: its topic and its
// shop's domain, each once under either header spelling.
func shopifyEvent(h http.Header) ([]string, error) {
	topic, err := once(h, shopifyTopic, "X-Shopify-Topic", "Shopify-Topic")
	if err != nil {
		return nil, err
	}
	shop, err := once(h, shopifyShop, "X-Shopify-Shop-Domain", "Shopify-Shop-Domain")
	if err != nil {
		return nil, err
	}
	return []string{topic, shop}, nil
}

// The grammars of unsigned event headers, as the providers write them:
// another spelling of the same event is refused, never a new key.
var (
	githubEvent  = regexp.MustCompile(`^[a-z_]+$`)
	shopifyTopic = regexp.MustCompile(`^[a-z_]+/[a-z_]+$`)
	shopifyShop  = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*\.myshopify\.com$`)
)

// errEventMalformed means an unsigned event header is missing, repeated,
// or not in its provider's grammar.
var errEventMalformed = errors.New("event header malformed")

// once is the one value h carries under names (the spellings of one
// header), in grammar: missing, repeated (under one name or several) or
// another form is errEventMalformed.
func once(h http.Header, grammar *regexp.Regexp, names ...string) (string, error) {
	var vals []string
	for _, n := range names {
		vals = append(vals, h.Values(n)...)
	}
	switch {
	case len(vals) != 1:
		return "", fmt.Errorf("%w: %s must appear once, it appears %d times", errEventMalformed, names[0], len(vals))
	case len(vals[0]) > 128 || !grammar.MatchString(vals[0]):
		return "", fmt.Errorf("%w: %s %.64q is not in the provider's form (%s)", errEventMalformed, names[0], vals[0], grammar.String())
	}
	return vals[0], nil
}

// header is the first of names that h carries ("" when none).
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

var (
	errEventNotAccepted = errors.New("event not accepted")
	errSigMissing       = errors.New("no signature header")
	errSigWrong         = errors.New("no signature matches any of the route's secrets")
	errSigStale         = errors.New("the signed timestamp is outside the route's tolerance")
)
