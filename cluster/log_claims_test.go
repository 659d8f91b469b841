package cluster

import (
	"context"
	"testing"

	"github.com/peatmq/peat/cluster/faultnet"
)

// claimSite is fwdSite on faultnet with min_insync_replicas 1: leader
// leads stream "s", next (the controller) is first in line to succeed
// it, and far is the third replica.
func claimSite(t *testing.T) (fnet *faultnet.Network, leader, next, far *logNode, kill func(*logNode)) {
	t.Helper()
	fnet = faultnet.New()
	leader, others, kill := fwdSiteNet(t, 1, LogConfig{}, fnet)
	return fnet, leader, others[0], others[1], kill
}

// isolate cuts a's cluster transport from b's both ways, connections
// open now included (Serf and Raft still reach: both stay alive).
func isolate(fnet *faultnet.Network, a, b *logNode) {
	fnet.Partition(a.node.ID(), b.node.ID())
	fnet.Drop(a.node.ID(), b.node.ID())
}

// waitLeads waits until ln leads stream "s".
func waitLeads(t *testing.T, ln *logNode) {
	t.Helper()
	eventually(t, ln.node.ID()+" leads s", func() bool {
		s, _ := ln.log.Stream("s").(*stream)
		return s != nil && s.leading() != nil
	})
}

// TestLog_ClaimHeldAcrossAFailover: a consumer on one node holds a
// group; the leader dies; a second consumer claims the group on the new
// leader before the holder's node could tell it anything (its link to the
// new leader is cut): refused, naming the holder, since the claim was
// replicated with the stream's state before it was granted.
func TestLog_ClaimHeldAcrossAFailover(t *testing.T) {
	fnet, leader, next, far, kill := claimSite(t)
	if ok, cur := far.log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("first claim refused, naming %q", cur)
	}
	isolate(fnet, far, next)
	kill(leader)
	waitLeads(t, next)
	if ok, cur := next.log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("a second consumer's claim on the new leader = %v %q, want refused naming c1", ok, cur)
	}
	// The holder keeps it once its node reaches the new leader again, and
	// a claim from a third node is refused too.
	fnet.Heal(far.node.ID(), next.node.ID())
	eventually(t, "the holder's claim decided again", func() bool {
		ok, _ := far.log.Route("s/x").Claim("g/y", "c1")
		return ok
	})
	if ok, cur := next.log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("after healing, a second consumer's claim = %v %q, want refused naming c1", ok, cur)
	}
}

// TestLog_UnclaimWhileLeaderUnreachable: a holder gives its group up
// while its node cannot reach the stream's leader; once it can, the
// release lands and another consumer takes the group, with the holder's
// node alive throughout.
func TestLog_UnclaimWhileLeaderUnreachable(t *testing.T) {
	fnet, leader, next, far, _ := claimSite(t)
	if ok, cur := far.log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("first claim refused, naming %q", cur)
	}
	isolate(fnet, far, leader)
	far.log.Route("s/x").Unclaim("g/y", "c1")
	if ok, cur := next.log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("while the release cannot reach the leader: claim = %v %q, want refused naming c1", ok, cur)
	}
	fnet.Heal(far.node.ID(), leader.node.ID())
	eventually(t, "another consumer takes the group once the release reached the leader", func() bool {
		ok, _ := next.log.Route("s/x").Claim("g/y", "c2")
		return ok
	})
	// The holder's node does not take it back by itself.
	if ok, cur := leader.log.Route("s/x").Claim("g/y", "c3"); ok || cur != "c2" {
		t.Fatalf("claim on the leader = %v %q, want refused naming c2", ok, cur)
	}
}

// TestLog_ClaimOfDeadLeadersClient: the group's consumer is a client of
// the stream's leader; the leader dies; once the site has it failed,
// a consumer on another node takes the group from the new leader, which
// found the dead node's claim in the replicated state.
func TestLog_ClaimOfDeadLeadersClient(t *testing.T) {
	_, leader, next, far, kill := claimSite(t)
	if ok, cur := leader.log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("first claim refused, naming %q", cur)
	}
	// The claim is in every replica's state (answered once the ISR held it).
	for _, ln := range []*logNode{next, far} {
		h, ok, err := ln.log.Stream("s").(*stream).loadClaim("g/y")
		if err != nil || !ok || h.holder != "c1" || h.node != leader.node.ID() {
			t.Fatalf("%s holds claim %+v %v %v, want c1 of %s", ln.node.ID(), h, ok, err, leader.node.ID())
		}
	}
	kill(leader)
	waitLeads(t, next)
	eventually(t, "a consumer on another node takes the dead node's group", func() bool {
		ok, _ := far.log.Route("s/x").Claim("g/y", "c2")
		return ok
	})
}

// TestLog_ClaimRepair: a claim in the state naming a client of a live
// node that does not hold it (a claim written, but never answered, before
// its leader died) is released by that node, and the group can be
// claimed again.
func TestLog_ClaimRepair(t *testing.T) {
	_, leader, next, far, _ := claimSite(t)
	ls := leader.log.Stream("s").(*stream)
	ghost := claimHolder{holder: "ghost", node: far.node.ID(), epoch: far.node.Epoch()}
	if err := ls.writeState(context.Background(), ls.leading(), map[string][]byte{claimStateKey("g/y"): ghost.encode()}, nil, waitISR); err != nil {
		t.Fatalf("write the claim: %v", err)
	}
	if ok, cur := next.log.Route("s/x").Claim("g/y", "c2"); ok || cur != "ghost" {
		t.Fatalf("claim = %v %q, want refused naming ghost", ok, cur)
	}
	eventually(t, "the ghost's node releases it", func() bool {
		ok, _ := next.log.Route("s/x").Claim("g/y", "c2")
		return ok
	})
}
