// Package poll waits in tests for a condition that another goroutine or
// process makes true.
package poll

import (
	"testing"
	"time"
)

// Timeout is how long Until waits.
const Timeout = 10 * time.Second

// Until polls cond every 20ms until it holds, failing t with what when it
// still does not after Timeout.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
