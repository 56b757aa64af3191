package proxy

import (
	"errors"
	"net/http"
	"testing"
	"time"
)

// TestWebhookPublishedVectors (issue 41, item 7): verification against
// the examples the providers publish for checking an implementation.
// GitHub's "Validating webhook deliveries" page gives a secret, a payload
// and the X-Hub-Signature-256 they make; the Standard Webhooks
// specification (and Svix's documentation, under its own header names)
// gives a secret, an id, a timestamp, a body and the signature. Stripe's
// and Shopify's documentation publish no such triple: Stripe deliveries
// are signed by stripe-go's own helper in compat/ (TestStripeWebhook),
// Svix's and the Standard Webhooks libraries sign in compat/ too
// (TestStandardWebhooksSigners).
func TestWebhookPublishedVectors(t *testing.T) {
	github := &Webhook{Provider: WebhookGitHub, Secrets: [][]byte{[]byte("It's a Secret to Everybody")}}
	standard := &Webhook{Provider: WebhookStandard, Secrets: [][]byte{[]byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")}}
	signedAt := time.Unix(1614265330, 0)
	stdHeaders := func(prefix string) http.Header {
		h := http.Header{}
		h.Set(prefix+"Id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
		h.Set(prefix+"Timestamp", "1614265330")
		h.Set(prefix+"Signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
		return h
	}
	for _, tc := range []struct {
		name   string
		wh     *Webhook
		header http.Header
		body   string
		want   error
	}{
		{"github", github, http.Header{"X-Hub-Signature-256": {"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}}, "Hello, World!", nil},
		{"github, the payload changed", github, http.Header{"X-Hub-Signature-256": {"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}}, "Hello, World?", errSigWrong},
		{"standard webhooks", standard, stdHeaders("Webhook-"), `{"test": 2432232314}`, nil},
		{"svix's header names", standard, stdHeaders("Svix-"), `{"test": 2432232314}`, nil},
		{"standard webhooks, the body changed", standard, stdHeaders("Webhook-"), `{"test": 2432232315}`, errSigWrong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.wh.headers(tc.header, signedAt)
			if err == nil {
				err = tc.wh.verify(d, []byte(tc.body))
			}
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("verify: %v, want %v", err, tc.want)
			}
		})
	}
}
