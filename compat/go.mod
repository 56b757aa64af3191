module github.com/idemproxy/idemproxy/compat

go 1.26.8

require (
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/stripe/stripe-go/v82 v82.5.1
)

require github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
