//go:build race

package mqtt

// raceEnabled: the race detector enlarges stack frames, so stack-size
// checks hold only without it.
const raceEnabled = true
