package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/mqtt"
)

// cutFrom cuts every link between a and b, both ways: the cluster
// transport (forwards, fetches, commands, heartbeats) and Raft. Serf,
// on loopback, still sees both alive; heal undoes it.
func cutFrom(fnet *faultnet.Network, a, b *testNode, heal bool) {
	ai, bi := a.Node.ID(), b.Node.ID()
	for _, l := range [][2]string{{ai, bi}, {ai, bi + "/raft"}, {bi, ai + "/raft"}} {
		if heal {
			fnet.Heal(l[0], l[1])
		} else {
			fnet.Partition(l[0], l[1])
		}
	}
}

// Only the link between a stream's leader and the controller is cut;
// Serf still shows every node alive and the leader still reaches the
// third node. Without broker heartbeats every producer hung for the
// whole cut: the leader stops committing once it cannot hear the
// controller, and nothing deposed it. With them the controller fences
// the leader when its session expires and elects an in-sync follower;
// the cut-off leader refuses its own producers with a reason, and says
// it is cut off (/readyz). Healed, it is back in the ISR.
func TestSite_LeaderCutFromTheControllerIsFenced(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2})
	ctl, far := others[0], others[1]
	if _, err := logAppend(t, leader.Log.Stream("s"), logRecs(5, "before")...); err != nil {
		t.Fatal(err)
	}
	epoch := streamState(ctl.Node).LeaderEpoch

	cutAt := time.Now()
	cutFrom(fnet, leader, ctl, false)
	var refusals int
	eventually(t, "a publish through "+far.Node.ID()+" acknowledged under a new leader", func() bool {
		_, err := logAppend(t, far.Log.Stream("s"), logRecs(1, "during")...)
		if err != nil {
			refusals++
		}
		return err == nil
	})
	resumed := time.Since(cutAt)
	st := streamState(ctl.Node)
	if st.Leader == leader.Node.ID() || st.LeaderEpoch <= epoch || st.InISR(leader.Node.ID()) {
		t.Fatalf("after the cut: leader %s in epoch %d, ISR %v; want another leader than %s, epoch above %d, and it fenced",
			st.Leader, st.LeaderEpoch, st.ISR, leader.Node.ID(), epoch)
	}
	t.Logf("acknowledgements through %s resumed %v after the cut (%d refusals meanwhile)", far.Node.ID(), resumed.Round(time.Millisecond), refusals)

	// The old leader's own producers get a refusal that says why.
	if leader.Node.HearsController() {
		t.Fatal("the cut-off leader says it hears the controller")
	}
	_, err := logAppend(t, leader.Log.Stream("s"), logRecs(1, "cut")...)
	if rf, ok := errors.AsType[*mqtt.Refusal](err); !ok || !errors.Is(err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("append on the cut-off leader: %v; want a refusal with a reason (leader unavailable)", err)
	} else {
		t.Logf("the cut-off leader refuses: %s", rf.Reason)
	}

	cutFrom(fnet, leader, ctl, true)
	eventually(t, leader.Node.ID()+" back in the ISR", func() bool { return streamState(ctl.Node).InISR(leader.Node.ID()) })
	eventually(t, leader.Node.ID()+" hears the controller again", leader.Node.HearsController)
	end, err := logAppend(t, leader.Log.Stream("s"), logRecs(1, "after")...)
	if err != nil {
		t.Fatalf("append through the healed node: %v", err)
	}
	for _, ln := range []*testNode{leader, ctl, far} {
		got := committedRecs(t, ln.Node.ID(), ln.Log.Stream("s"), end+1)
		if got[end].Topic != "s/after/0" {
			t.Fatalf("%s: offset %d holds %s", ln.Node.ID(), end, got[end].Topic)
		}
	}
}

// TestSite_AppendWaitingOnACutOffLeaderIsGivenUpAtTheCutOff: a leader
// cut off from the site takes an append a moment before it counts as cut
// off (its producer had just moved to it); the append cannot commit, and
// is given up (publish again) once the node is cut off and refuses new
// appends, not a whole session timeout after it was taken.
func TestSite_AppendWaitingOnACutOffLeaderIsGivenUpAtTheCutOff(t *testing.T) {
	const session = 8 * time.Second // cut off 6 s after the last contact
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2, SessionTimeout: session})
	if _, err := logAppend(t, leader.Log.Stream("s"), logRecs(1, "before")...); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	for _, o := range others {
		cutFrom(fnet, leader, o, false)
	}
	time.Sleep(time.Until(cutAt.Add(session*3/4 - 1500*time.Millisecond)))
	if leader.Node.CutOff() || leader.Node.HearsController() {
		t.Fatalf("%v after the cut: cut off %v, hears the controller %v; want not cut off yet, and not hearing it",
			time.Since(cutAt).Round(time.Millisecond), leader.Node.CutOff(), leader.Node.HearsController())
	}
	took := time.Now()
	res := appendNoWait(leader.Log.Stream("s"), "late")
	var r appendAt
	select {
	case r = <-res:
	case <-time.After(time.Minute):
		t.Fatal("the append on the cut-off leader was never answered")
	}
	waited := time.Since(took)
	if rf, ok := errors.AsType[*mqtt.Refusal](r.err); !ok || !errors.Is(r.err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("append on the cut-off leader: first %d, %v; want a refusal of unknown fate", r.first, r.err)
	} else {
		t.Logf("refused %v after it was taken, %v after the cut: %s", waited.Round(time.Millisecond),
			time.Since(cutAt).Round(time.Millisecond), rf.Reason)
	}
	if waited >= session/2 {
		t.Errorf("refused %v after it was taken: held past the node's cut-off (%v after the cut) for the session timeout",
			waited.Round(time.Millisecond), session*3/4)
	}
}

// TestSite_AppendTakenBeforeTheControllerWasLostWaitsOutTheCutOff: an
// append a leader took while it could commit, then lost the controller
// (an election, a cut that heals) for longer than the cut-off but less
// than a session, is held and acknowledged once the leader hears the
// controller again, not refused at the cut-off: its producer, on a
// healthy node, would be disconnected (MQTT 3.1.1) for a controller
// election.
func TestSite_AppendTakenBeforeTheControllerWasLostWaitsOutTheCutOff(t *testing.T) {
	const session = 8 * time.Second // cut off 6 s after the last contact
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 3, SessionTimeout: session})
	ctl := others[0]
	if _, err := logAppend(t, leader.Log.Stream("s"), logRecs(1, "before")...); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	cutFrom(fnet, leader, ctl, false) // the controller's fetches stop too: min ISR 3 holds the commit
	res := appendNoWait(leader.Log.Stream("s"), "held")
	eventually(t, leader.Node.ID()+" to count itself cut off", leader.Node.CutOff)
	time.Sleep(session / 16) // the answer loop looks every session/8 while it cannot commit
	select {
	case r := <-res:
		t.Fatalf("answered while cut off, %v after the cut: first %d, %v; want held", time.Since(cutAt).Round(time.Millisecond), r.first, r.err)
	default:
	}
	if time.Since(cutAt) >= session*7/8 {
		t.Fatalf("the cut-off came %v after the cut: too late to heal within the session", time.Since(cutAt))
	}
	cutFrom(fnet, leader, ctl, true)
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("append taken before the controller was lost: %v; want it acknowledged after the heal", r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the held append was never answered")
	}
}
