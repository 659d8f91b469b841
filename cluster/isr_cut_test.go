package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
)

// TestReplicator_FollowerCutFromTheLeaderLeavesTheISR: a follower whose
// link to the leader alone is cut (both still reach the controller, so
// neither is fenced) stops fetching; the leader drops it from the ISR
// once it has not heard from it for the session timeout, not after
// replica_lag_max (five minutes here), and acks: all appends commit again
// on the rest of the ISR.
func TestReplicator_FollowerCutFromTheLeaderLeavesTheISR(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, Net: fnet, LagMax: 5 * time.Minute})
	ctl, cut := others[0], others[1]
	if !ctl.Node.IsController() || cut.Node.IsController() {
		t.Fatal("fwdSite's first other is not the controller")
	}
	eventually(t, "every replica in the ISR", func() bool {
		st, _ := leader.Node.State()
		return len(st.Streams["s"].ISR) == 3
	})
	if _, err := logAppend(t, leader.Log.Route("s/x"), logRecs(1, "before")...); err != nil {
		t.Fatalf("append before the cut: %v", err)
	}

	fnet.Cut(leader.Node.ID(), cut.Node.ID())
	res := make(chan error, 1)
	go func() {
		_, err := logAppend(t, leader.Log.Route("s/x"), logRecs(1, "during")...)
		res <- err
	}()
	deadline := time.Now().Add(30 * time.Second) // ten session timeouts; replica_lag_max is 5 min
	for {
		st, _ := leader.Node.State()
		if isr := st.Streams["s"].ISR; !slices.Contains(isr, cut.Node.ID()) {
			t.Logf("ISR %v", isr)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower cut from the leader is still in the ISR %v after 30 s", st.Streams["s"].ISR)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("append during the cut: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the append during the cut is not acknowledged once the ISR dropped the cut follower")
	}
	if b := leader.Node.View().Brokers[cut.Node.ID()]; b == nil || !b.Alive {
		t.Error("the cut follower was fenced: the test cut more than its link to the leader")
	}
}
