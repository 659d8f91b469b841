//go:build race

package logstore

// raceEnabled: the race detector slows Badger's write path about tenfold;
// the heaviest tests write less under it.
const raceEnabled = true
