package proxy

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/claim"
)

// Webhook receivers. Providers deliver webhooks at least once: Stripe,
// GitHub, Shopify and every Standard Webhooks sender retry on a timeout or
// a 5xx, and a legacy handler then books the payment twice. On a route
// with a webhook, a delivery is verified by the provider's signature over
// the raw body before anything is claimed or forwarded (a forged first
// delivery cannot poison the key: it is refused, and the real one
// executes later). Until it verifies, its bytes count against the peer
// that sends it; then the principal is the provider, so any peer may
// deliver once signed. The key is taken from what the provider signs (the
// event id for Stripe and Standard Webhooks, the body's SHA-256 for
// GitHub and Shopify, whose delivery ids are unsigned), so a captured
// delivery resent under a new id is a redelivery; keys are always scoped
// by route. The fingerprint covers the body, never the signature headers,
// which providers renew on every retry. A redelivery then gets the stored
// answer.

// principal is the principal of every verified delivery: the provider.
func (wh *Webhook) principal() string { return webhookPrincipals + wh.Provider }

// headers reads the delivery's signature headers and, where the provider
// signs a timestamp, checks that it is within the tolerance: all before
// the body is read, so that a sender without a plausible signature holds
// no buffer for long.
func (wh *Webhook) headers(h http.Header, now time.Time) (signed, error) {
	d, err := providers[wh.Provider].headers(h) // New refused an unknown one
	if err != nil || d.ts == "" {
		return d, err
	}
	tolerance := wh.Tolerance
	if tolerance <= 0 {
		tolerance = 5 * time.Minute
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(d.ts), 10, 64)
	if err != nil {
		return d, fmt.Errorf("the signed timestamp %q is not a Unix time", d.ts)
	}
	if age := now.Sub(time.Unix(sec, 0)); age > tolerance || age < -tolerance {
		return d, errSigStale
	}
	return d, nil
}

// verify checks the delivery's signature over its raw body: one of its
// signatures is the MAC the provider computes under one of the route's
// secrets (compared in constant time).
func (wh *Webhook) verify(d signed, body []byte) error {
	p := providers[wh.Provider]
	for _, secret := range wh.Secrets {
		want := p.sign(secret, d, body)
		if want == nil {
			continue
		}
		for _, s := range d.sigs {
			if hmac.Equal(s, want) {
				return nil
			}
		}
	}
	return errSigWrong
}

// event reads what an unsigned-event provider's delivery is about (its
// event, and Shopify's shop), bounded: each header once, as the provider
// writes it (no case folding: another spelling is another key, so it is
// refused), and the event among the route's Events when they are set. A
// captured body then executes at most once per event the route accepts.
// Nil for a provider that signs what keys its deliveries.
func (wh *Webhook) event(h http.Header) ([]string, error) {
	read := providers[wh.Provider].event
	if read == nil {
		return nil, nil
	}
	ev, err := read(h)
	if err != nil {
		return nil, err
	}
	if len(wh.Events) > 0 && !slices.Contains(wh.Events, ev[0]) {
		return nil, fmt.Errorf("%w: %q is not among the events this route accepts (%s)", errEventNotAccepted, ev[0], strings.Join(wh.Events, ", "))
	}
	return ev, nil
}

// key is the delivery's idempotency key, taken from what the provider
// signs (and the event parts it keys), so that nobody without the secret
// can make a captured delivery pass for a new one.
func (wh *Webhook) key(d signed, body []byte) (string, error) {
	p := providers[wh.Provider]
	if p.eventKeyed > 0 && len(d.event) > p.eventKeyed {
		d.event = d.event[:p.eventKeyed]
	}
	id, err := p.key(d, body)
	switch {
	case err != nil:
		return "", err
	case len(id) > maxKeyLen:
		return "", errKeyTooLong
	case !visibleASCII(id):
		return "", errKeyChars
	}
	return id, nil
}

// legacyKeys are the keys earlier releases stored the delivery (its
// signed part d) under, newest first: v0.8.0's, which named every part of
// its event (Shopify's shop too); v0.6.0's, the body's digest alone, for
// a provider keyed by the body's digest; v0.5.0's, the delivery id
// (unsigned where the provider does not sign it), in the scope the route
// had then.
func legacyKeys(rt *route, h http.Header, d signed, key string, body []byte) []legacyKey {
	p := providers[rt.settings.Webhook.Provider]
	if p.unsignedID == nil {
		return []legacyKey{{scope: rt.legacyScope, key: key, change: keysV06}}
	}
	var keys []legacyKey
	if p.wideKeyChange != 0 && len(d.event) > p.eventKeyed {
		if wide, err := p.key(d, body); err == nil {
			keys = append(keys, legacyKey{scope: rt.scope, key: wide, change: p.wideKeyChange})
		}
	}
	return append(keys,
		legacyKey{scope: rt.scope, key: bodySum(body), change: keysV07},
		legacyKey{scope: rt.legacyScope, key: p.unsignedID(h), change: keysV06},
	)
}

// admitDelivery is the admission of a webhook route: the signature
// headers, the body, the signature, then the key from what is signed.
// Or the reply that refused it.
func (x *exchange) admitDelivery() (admitted, *reply) {
	wh := x.rt.settings.Webhook
	if x.r.URL.Path != x.path {
		return admitted{}, refuse(outcomeRejected, probPathNotCanonical.with("send it to "+x.path+", the path this route protects"))
	}
	if rep := x.keyHeaderAdmitted(); rep != nil {
		return admitted{}, rep
	}
	// Until its signature verifies, a delivery's bytes are its sending
	// peer's: unsigned bodies must not fill the provider's share, which
	// every real delivery needs.
	x.bufs.holder = x.sendingPeer()
	d, err := wh.headers(x.r.Header, x.p.now())
	if err != nil {
		// Close after answering: otherwise net/http reads the unread
		// body before writing the answer.
		x.w.Header().Set("Connection", "close")
		return admitted{}, x.signatureInvalid(err)
	}
	body, rep := x.readBody()
	if rep != nil {
		return admitted{}, rep
	}
	if err := wh.verify(d, body); err != nil {
		return admitted{}, x.signatureInvalid(err)
	}
	if rep := x.holdAs(wh.principal()); rep != nil {
		return admitted{}, rep
	}
	if d.event, err = wh.event(x.r.Header); err != nil {
		x.webhookResult = webhookRefused
		if errors.Is(err, errEventNotAccepted) {
			return admitted{}, refuse(outcomeRejected, probEventNotAccepted.with(err.Error()+"; nothing was claimed or forwarded"))
		}
		return admitted{}, refuse(outcomeRejected, probEventMalformed.with(err.Error()+"; nothing was claimed or forwarded"))
	}
	key, err := wh.key(d, body)
	switch {
	case errors.Is(err, errKeyMissing):
		return admitted{}, refuse(outcomeRejected, probKeyMissing.with(err.Error()))
	case err != nil:
		return admitted{}, refuse(outcomeRejected, probKeyMalformed.with(err.Error()))
	}
	x.r.Header.Set(x.rt.settings.KeyHeader, key) // the upstream can dedupe on it too
	return admitted{as: admittedAs{principal: x.bufs.holder, key: key}, body: body, legacy: legacyKeys(x.rt, x.r.Header, d, key, body)}, nil
}

func (x *exchange) signatureInvalid(err error) *reply {
	x.webhookResult = webhookSigInvalid
	return refuse(outcomeRejected, probSignatureInvalid.with(err.Error()+"; nothing was claimed or forwarded"))
}

// sendingPeer is whom a delivery's bytes count against until its
// signature verifies: its peer's address or, from a trusted proxy, the
// client address that proxy forwards (the last X-Forwarded-For entry);
// an IPv6 address by its /64, which one sender usually holds whole. It is
// under webhook:, which no identity source may assert.
func (x *exchange) sendingPeer() string {
	host, _, err := net.SplitHostPort(x.r.RemoteAddr)
	if err != nil {
		host = x.r.RemoteAddr
	}
	if x.trusted {
		if xff := x.r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			last := xff[len(xff)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			if last = strings.TrimSpace(last); last != "" {
				host = last
			}
		}
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return webhookPrincipals + "peer " + host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		addr = netip.PrefixFrom(addr, 64).Masked().Addr()
	}
	return webhookPrincipals + "peer " + addr.String()
}

// holdAs moves the request body's bytes from the sending peer to
// principal, the provider, once the signature verified; or the reply
// that refused it, the provider's share being full.
func (x *exchange) holdAs(principal string) *reply {
	if err := x.p.buffers.move(x.bufs.holder, principal, cap(x.bufs.reqBuf)); err != nil {
		x.w.Header().Set("Connection", "close")
		return bufferRefused(err, "nothing was claimed or forwarded")
	}
	x.bufs.holder = principal
	return nil
}

// useLegacyKey makes the Redis key an earlier release stored this
// delivery under the exchange's key when it still holds a record (v0.6.0:
// keyed by the body's digest alone; v0.5.0: by its delivery id, or scoped
// by principal): a redelivery across the upgrade is answered from that
// record instead of executing again. Each is looked for one retention
// after this store first served the keys that replaced it (Store.Since).
// It returns the reply when the store failed.
func (a *attempt) useLegacyKey(keys []legacyKey) *reply {
	for _, k := range keys {
		legacy := a.p.codec.Key(a.principal, k.scope, k.key)
		if k.key == "" || legacy == a.hashedKey || !a.p.keyChanges[k.change].reading(a, keyChangeMarkers[k.change]) {
			continue
		}
		var rec *claim.Record
		err := a.detached("get", func(ctx context.Context) (err error) {
			rec, _, err = a.p.store.Get(ctx, legacy)
			return err
		})
		if err != nil {
			return a.storeFailed("get", err, nil)
		}
		if rec != nil {
			a.hashedKey = legacy
			return nil
		}
	}
	return nil
}

// reading reports whether a, a delivery, still looks for the keys the
// change marked by marker replaced: within its route's retention of the
// change, and whenever the marker cannot be read (a store call of a's).
func (k *keyChange) reading(a *attempt, marker string) bool {
	since := k.since.Load()
	if since == 0 {
		k.mu.Lock()
		defer k.mu.Unlock()
		if since = k.since.Load(); since == 0 {
			var t time.Time
			err := a.detached("get", func(ctx context.Context) (err error) {
				t, err = a.p.store.Since(ctx, marker, a.p.now())
				return err
			})
			if err != nil {
				return true
			}
			since = t.UnixNano()
			k.since.Store(since)
		}
	}
	return a.p.now().Before(time.Unix(0, since).Add(a.rt.settings.Retention))
}

// webhookOutcome is a delivery's result label, from its outcome.
func (x *exchange) webhookOutcome() string {
	if x.webhookResult != "" {
		return x.webhookResult
	}
	switch x.res.outcome {
	case outcomeStored, outcomeClaimed, outcomeReleased, outcomeUpstreamTimeout, outcomeStoreError, outcomeFenceLost:
		return webhookExecuted
	case outcomeReplayed:
		return webhookReplayed
	case outcomeConflict:
		return webhookInProgress
	}
	return webhookRefused
}
