//go:build !race

package claim

const raceEnabled = false
