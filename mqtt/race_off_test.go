//go:build !race

package mqtt

const raceEnabled = false
