package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/mqtt"
)

// refusedFor fails t unless err is a refusal (ErrLeaderUnavailable) in
// the words want.
func refusedFor(t *testing.T, what string, err error, want string) {
	t.Helper()
	rf, ok := errors.AsType[*mqtt.Refusal](err)
	if !ok || !errors.Is(err, mqtt.ErrLeaderUnavailable) || rf.Reason != want {
		t.Fatalf("%s: %v; want the refusal %q", what, err, want)
	}
}

// A follower cut off from the controller and from the stream's leader
// (the small side of a split) used to forward its producers' appends into
// the cut and refuse them only at the forward timeout, so producers that
// came to it from the other side waited that long before moving on. Now
// the forward unanswered while the node is cut off makes it probe the
// leader; no answer, and the append is refused at once with a reason that
// says why (its fate unknown: it was sent), and so is the next, never
// sent, until the node is back: at once for a while, then when a dial to
// the leader fails.
func TestSite_CutOffFollowerGivesUpForwardsItsLeaderCannotHear(t *testing.T) {
	const forwardTimeout = 30 * time.Second // what the appends would wait without the probe
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2, ForwardTimeout: forwardTimeout})
	ctl, far := others[0], others[1]
	s := far.Log.Stream("s")
	if _, err := logAppend(t, s, logRecs(1, "before")...); err != nil { // the forward connection is up
		t.Fatal(err)
	}
	cutFrom(fnet, far, leader, false)
	cutFrom(fnet, far, ctl, false)
	eventually(t, far.Node.ID()+" to count itself cut off", far.Node.CutOff)

	start := time.Now()
	_, err := logAppend(t, s, logRecs(1, "sent")...)
	if took := time.Since(start); took >= forwardTimeout/2 {
		t.Fatalf("append sent into the cut answered after %v (%v); want well before the forward timeout %v", took, err, forwardTimeout)
	}
	refusedFor(t, "append sent into the cut", err, fateCutOff)
	_, err = logAppend(t, s, logRecs(1, "never-sent")...)
	refusedFor(t, "append after the leader was found out of reach", err, errNodeCutOff.(*mqtt.Refusal).Reason)
	time.Sleep(cutOffRefuseFor) // then a new forwarder tries again: its dial is the probe
	_, err = logAppend(t, s, logRecs(1, "dialled")...)
	refusedFor(t, "append whose dial to the leader failed", err, errNodeCutOff.(*mqtt.Refusal).Reason)

	cutFrom(fnet, far, leader, true)
	cutFrom(fnet, far, ctl, true)
	eventually(t, "an append through "+far.Node.ID()+" after the heal", func() bool {
		_, err := logAppend(t, s, logRecs(1, "healed")...)
		return err == nil
	})
}

// A follower cut off from the controller alone (or between controllers)
// still reaches the stream's leader, which may be slow to answer (here
// every answer is delayed past the probe's start): the probe is answered,
// and the append is acknowledged, not refused. Refusing every append of a
// cut-off node at once refused producers on healthy followers during an
// ordinary controller election.
func TestSite_CutOffFollowerForwardsToALeaderItStillReaches(t *testing.T) {
	const (
		probeAfter = 50 * time.Millisecond
		delay      = 400 * time.Millisecond // each answer from the leader: past probeAfter, within ProbeWait
	)
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2, ProbeAfter: probeAfter, ProbeWait: 10 * time.Second})
	ctl, far := others[0], others[1]
	s := far.Log.Stream("s")
	if _, err := logAppend(t, s, logRecs(1, "before")...); err != nil {
		t.Fatal(err)
	}
	cutFrom(fnet, far, ctl, false)
	eventually(t, far.Node.ID()+" to count itself cut off", far.Node.CutOff)
	fnet.Delay(leader.Node.ID(), far.Node.ID(), delay)

	start := time.Now()
	if _, err := logAppend(t, s, logRecs(3, "slow")...); err != nil {
		t.Fatalf("append through a cut-off follower that reaches the leader: %v", err)
	}
	if took := time.Since(start); took < delay || !far.Node.CutOff() {
		t.Fatalf("answered after %v, cut off %v: the probe had no reason to run", took, far.Node.CutOff())
	}
}
