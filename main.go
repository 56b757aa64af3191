// Command idemproxy is a reverse-proxy sidecar that makes retries of unsafe
// HTTP requests safe: each idempotency key executes once upstream and every
// retry gets the stored answer.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "idemproxy:", err)
		os.Exit(1)
	}
}
