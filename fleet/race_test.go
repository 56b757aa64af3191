//go:build race

package fleet

// raceEnabled: the mixed-fleet test builds and runs two binaries, neither
// built with -race; it runs in the plain go test pass only.
const raceEnabled = true
