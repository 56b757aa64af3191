//go:build race

package claim

// raceEnabled: allocation counts are checked without the race detector,
// which allocates on its own.
const raceEnabled = true
