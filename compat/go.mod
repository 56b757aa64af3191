module github.com/idemproxy/idemproxy/compat

go 1.26.8

require (
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0
	github.com/stripe/stripe-go/v82 v82.5.1
	github.com/svix/svix-webhooks v1.44.0
)

require (
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/idemproxy/idemproxy v0.0.0
	gopkg.in/validator.v2 v2.0.1 // indirect
)

replace github.com/idemproxy/idemproxy => ../
