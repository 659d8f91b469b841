package testwait

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records a failure instead of ending the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = format
	panic(f) // Fatalf ends the caller, as runtime.Goexit would
}

func run(tb *fakeTB, f func()) {
	defer func() {
		if r := recover(); r != nil && r != tb {
			panic(r)
		}
	}()
	f()
}

func TestEventually_ReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	tb := &fakeTB{TB: t}
	run(tb, func() { EventuallyWithin(tb, time.Minute, "n reaches 5", func() bool { return n.Add(1) >= 5 }) })
	if tb.failed != "" || n.Load() != 5 {
		t.Fatalf("failed %q after %d looks, want success after 5", tb.failed, n.Load())
	}
}

func TestEventually_FailsAfterTheLimit(t *testing.T) {
	tb := &fakeTB{TB: t}
	start := time.Now()
	run(tb, func() { EventuallyWithin(tb, 50*time.Millisecond, "never", func() bool { return false }) })
	if !strings.Contains(tb.failed, "timed out") {
		t.Fatalf("a condition that never holds: failure %q, want a time-out", tb.failed)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the limit", d)
	}
}
