package redisstore_test

import (
	"os"
	"testing"

	"github.com/idemproxy/idemproxy/internal/parallel"
)

func TestMain(m *testing.M) {
	// Each parallel test runs on Redis servers of its own (a Cluster, a
	// Sentinel), and mostly waits on them.
	parallel.AtLeast(4)
	os.Exit(m.Run())
}
