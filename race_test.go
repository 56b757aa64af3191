//go:build race

package main

// raceEnabled: the real-binary tests run in the plain pass only; under
// -race they would only test the binary again, slower (.ci/run's budget).
const raceEnabled = true
