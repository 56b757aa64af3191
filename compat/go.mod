module github.com/idemproxy/idemproxy/compat

go 1.26.8

require (
	connectrpc.com/connect v1.21.1
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/standard-webhooks/standard-webhooks/libraries v1.3.0
	github.com/stripe/stripe-go/v82 v82.5.1
	github.com/svix/svix-webhooks v1.44.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.13.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	github.com/rogpeppe/go-internal v1.16.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
)

require (
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/idemproxy/idemproxy v0.0.0
	gopkg.in/validator.v2 v2.0.1 // indirect
)

replace github.com/idemproxy/idemproxy => ../
