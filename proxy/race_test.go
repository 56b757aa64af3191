//go:build race

package proxy_test

// raceEnabled: allocation counts are measured without the race detector,
// which allocates on its own.
const raceEnabled = true
