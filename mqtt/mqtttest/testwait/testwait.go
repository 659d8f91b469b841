// Package testwait is the one polling helper of Peat's tests: wait until
// a condition holds, or fail the test. It imports only testing and time,
// so the tests of every package can use it without an import cycle.
//
// No test asserts timing with it: the limit only stops a broken test
// from hanging. A passing test never waits that long.
package testwait

import (
	"testing"
	"time"
)

// Limit is how long Eventually waits: generous for a loaded 2-core
// machine running the tests with -race.
const Limit = 30 * time.Second

// maxPoll is the longest pause between two looks at the condition; the
// pauses start at a millisecond and double up to it, so a condition that
// holds soon is seen at once and a slow one costs little CPU.
const maxPoll = 20 * time.Millisecond

// Eventually polls cond until it holds and fails the test if it does not
// within Limit; what says what was awaited.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	EventuallyWithin(tb, Limit, what, cond)
}

// EventuallyWithin is Eventually with another limit. Use it only where a
// test waits for something that can truly take longer than Limit, and say
// why beside the constant passed.
func EventuallyWithin(tb testing.TB, limit time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting until %s", limit, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, maxPoll)
	}
}

// SiteLimit is the limit for a site of in-process nodes to reach a
// state: Serf's failure detection takes seconds, then Raft elects, the
// controller registers brokers and elects leaders, replicas catch up, all
// of it under -race on a 2-core machine other tests share. Waits of 30 s
// there were seen to time out on such a machine; nothing in a passing
// test waits this long.
const SiteLimit = time.Minute
