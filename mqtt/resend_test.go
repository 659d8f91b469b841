package mqtt

import (
	"log/slog"
	"testing"
	"time"
)

// A connection that resumes a session while the delivery of an earlier
// connection is still ending (a $replay tap's goroutine exits after its
// connection has gone) resends what that one wrote with DUP 1
// [MQTT-3.3.1-1], and hands on the mark when it ends itself.
func TestResends_FollowAConnectionStillEnding(t *testing.T) {
	ss := newSessions()
	ss.w = newStateWriter(nil, time.Hour, slog.Default(), nil) // never runs: the marks' writes only queue
	ss.m["dur"] = &session{Subs: map[string]sessionSub{}}
	key := cursorKey{stream: "default", tap: "$replay/0/+/d/#"}

	old, untrackOld := ss.track("dur", key, nil)
	for off := range uint64(3) {
		old.wrote(off)
	}
	next, untrackNext := ss.track("dur", key, nil) // old's goroutine has not ended yet
	old.wrote(3)                                   // it was finishing a write
	untrackOld()
	for off := range uint64(4) {
		if !next.dup(off) {
			t.Fatalf("offset %d, written to the earlier connection, is not a resend", off)
		}
	}
	if next.dup(4) {
		t.Fatal("offset 4, never written, is a resend")
	}

	untrackNext()
	last, _ := ss.track("dur", key, nil)
	if !last.dup(3) || last.dup(4) {
		t.Fatalf("after both ended: dup(3) %v dup(4) %v, want true false", last.dup(3), last.dup(4))
	}
}
