package pgstore_test

import (
	"os"
	"testing"

	"github.com/idemproxy/idemproxy/internal/parallel"
)

func TestMain(m *testing.M) {
	// Each parallel test runs on a PostgreSQL server of its own, and
	// mostly waits on it.
	parallel.AtLeast(4)
	os.Exit(m.Run())
}
