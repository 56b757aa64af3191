package proxy_test

import (
	"os"
	"testing"

	"github.com/idemproxy/idemproxy/internal/parallel"
)

func TestMain(m *testing.M) {
	// The parallel tests each run on their own store and servers (Redis
	// topologies, failovers) and mostly wait on them.
	parallel.AtLeast(4)
	os.Exit(m.Run())
}
