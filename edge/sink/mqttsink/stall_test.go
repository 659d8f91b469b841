package mqttsink

import (
	"testing"
	"time"
)

// Quick acks go on after two stalls close together, stay on for
// quickAckFor, then go off; a lone slow ack, an ack with nothing else in
// flight, or stalls far apart turn nothing on.
func TestStallWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	stall := 2 * ackStall
	type step struct {
		at         time.Duration
		gap        time.Duration
		left       int
		change, on bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a lone stall", []step{{0, stall, 5, false, false}, {2 * stallSpan, time.Millisecond, 5, false, false}}},
		{"nothing else in flight", []step{{0, stall, 0, false, false}, {time.Millisecond, stall, 0, false, false}}},
		{"fast acks", []step{{0, ackStall, 5, false, false}, {time.Millisecond, ackStall, 5, false, false}}},
		{"stalls far apart", []step{{0, stall, 5, false, false}, {stallSpan + time.Millisecond, stall, 5, false, false}}},
		{"two stalls, then off after quickAckFor", []step{
			{0, stall, 5, false, false},
			{stallSpan / 2, stall, 5, true, true},
			{stallSpan, time.Millisecond, 5, false, true},
			{stallSpan/2 + quickAckFor, time.Millisecond, 5, true, false},
			{stallSpan/2 + quickAckFor + time.Millisecond, stall, 5, false, false}, // counted afresh
			{stallSpan/2 + quickAckFor + 2*time.Millisecond, stall, 5, true, true},
		}},
	} {
		var w stallWatch
		for i, s := range tc.steps {
			change, on := w.ack(at(s.at), s.gap, s.left)
			if change != s.change || (change && on != s.on) || w.on != s.on {
				t.Errorf("%s, step %d: ack = (%v, %v), on %v; want (%v, %v)", tc.name, i, change, on, w.on, s.change, s.on)
			}
		}
	}
}
