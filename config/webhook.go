package config

import (
	"fmt"
	"regexp"
	"time"
)

// Webhook providers (routes[].webhook.provider).
const (
	WebhookStripe   = "stripe"
	WebhookGitHub   = "github"
	WebhookShopify  = "shopify"
	WebhookStandard = "standard" // Standard Webhooks (standardwebhooks.com)
)

// WebhookProviders are the values routes[].webhook.provider accepts.
var WebhookProviders = []string{WebhookStripe, WebhookGitHub, WebhookShopify, WebhookStandard}

// DefaultWebhookTolerance is routes[].webhook.tolerance.
const DefaultWebhookTolerance = 5 * time.Minute

// Webhook is a route's webhook block.
type Webhook struct {
	// Provider is stripe, github, shopify or standard; empty: not a
	// webhook route.
	Provider string `yaml:"provider"`
	// SecretFiles hold the signing secrets; any one verifies (rotation).
	SecretFiles []string `yaml:"secret_files"`
	// Tolerance is how far a signed timestamp (stripe, standard) may be
	// from now.
	Tolerance time.Duration `yaml:"tolerance"`
	// Events are the GitHub events or Shopify topics the route accepts
	// (github, shopify: their event is not signed, so a captured body
	// executes at most once per event accepted); a delivery naming another
	// gets 400 event-not-accepted. Empty: every well-formed event.
	Events []string `yaml:"events"`
}

// WebhookEventGrammar is the form of an event name, by provider: GitHub's
// X-GitHub-Event, Shopify's topic, as the providers write them.
var WebhookEventGrammar = map[string]*regexp.Regexp{
	WebhookGitHub:  regexp.MustCompile(`^[a-z_]+$`),
	WebhookShopify: regexp.MustCompile(`^[a-z_]+/[a-z_]+$`),
}

func (w Webhook) validate(path string, add problemf) {
	if w.Provider == "" {
		if len(w.SecretFiles) > 0 {
			add(path+"provider", "must be set with secret_files: stripe, github, shopify or standard")
		}
		return
	}
	oneOf(path+"provider", w.Provider, add, WebhookProviders...)
	if len(w.SecretFiles) == 0 {
		add(path+"secret_files", "must name at least one file holding the provider's signing secret")
	}
	grammar := WebhookEventGrammar[w.Provider]
	if len(w.Events) > 0 && grammar == nil {
		add(path+"events", "applies to github and shopify, whose event is not signed; %s signs what keys its deliveries", w.Provider)
	}
	for i, e := range w.Events {
		if grammar != nil && !grammar.MatchString(e) {
			add(fmt.Sprintf("%sevents[%d]", path, i), "%q is not a %s event name as %s writes it (%s)", e, w.Provider, w.Provider, grammar.String())
		}
	}
	if w.Tolerance <= 0 || w.Tolerance > time.Hour {
		add(path+"tolerance", "must be between 1s and 1h (a signed timestamp further off is refused: replay protection), got %s", w.Tolerance)
	}
}

// webhookSettings are a webhook route's own defaults where it sets none:
// no new-key quota and the whole in-flight share. Every delivery is the
// provider's one principal, so defaults meant for one client's keys
// (quota.new_keys, max_in_flight_principal_share) would refuse a busy
// provider's real deliveries; only a valid signature creates a key.
func (r *Route) webhookSettings() {
	if !r.set["quota.new_keys"] {
		r.Settings.Quota.NewKeys = 0
	}
	if !r.set["max_in_flight_principal_share"] {
		r.Settings.MaxInFlightPrincipalShare = 1
	}
}
