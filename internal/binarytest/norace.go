//go:build !race

package binarytest

const raceEnabled = false
