package edge

import (
	"context"
	"testing"
	"time"
)

// A sink or source whose position commit cannot complete (in a site, the
// stream's other replicas gone) holds the node's shutdown no longer than
// the grace: stop gives the commit up, and a commit that completes in
// time is not given up.
func TestRunners_StopGivesUpAWaitingCommitAfterTheGrace(t *testing.T) {
	r := newRunners()
	r.grace = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	gaveUp := make(chan error, 1)
	r.wg.Go(func() {
		<-ctx.Done() // the run ends and commits its last position
		<-r.commits.Done()
		gaveUp <- r.commits.Err()
	})
	done := make(chan struct{})
	start := time.Now()
	go func() { r.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop still waits for a commit 10 s on")
	}
	if took := time.Since(start); took < r.grace {
		t.Errorf("stop gave up after %v, before the grace (%v)", took, r.grace)
	}
	if err := <-gaveUp; err == nil {
		t.Error("the commit was not given up")
	}

	r = newRunners()
	ctx, cancel = context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Go(func() {
		<-ctx.Done()
		select { // a commit that lands at once
		case <-r.commits.Done():
			t.Error("a commit under way when the run ended was given up at once")
		case <-time.After(50 * time.Millisecond):
		}
	})
	r.stop()
}
