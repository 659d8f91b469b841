package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
)

// claimSite is fwdSite on faultnet with min_insync_replicas 1: leader
// leads stream "s", next (the controller) is first in line to succeed
// it, and far is the third replica. Its tests cut a node's cluster
// transport from the controller and keep it alive meanwhile: the
// session timeout (heartbeats travel that transport) outlasts them, or
// the controller would fence the node, and its clients' claims with it.
func claimSite(t *testing.T) (fnet *faultnet.Network, leader, next, far *testNode, kill func(*testNode)) {
	t.Helper()
	fnet = faultnet.New()
	leader, others, kill := fwdSite(t, siteOpts{MinISR: 1, Net: fnet, SessionTimeout: 5 * time.Minute})
	return fnet, leader, others[0], others[1], kill
}

// isolate cuts a's cluster transport from b's both ways, connections
// open now included (Serf and Raft still reach: both stay alive).
func isolate(fnet *faultnet.Network, a, b *testNode) {
	fnet.Partition(a.Node.ID(), b.Node.ID())
	fnet.Drop(a.Node.ID(), b.Node.ID())
}

// waitLeads waits until ln leads stream "s".
func waitLeads(t *testing.T, ln *testNode) {
	t.Helper()
	eventually(t, ln.Node.ID()+" leads s", func() bool {
		s, _ := ln.Log.Stream("s").(*stream)
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
	if ok, cur := far.Log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("first claim refused, naming %q", cur)
	}
	isolate(fnet, far, next)
	kill(leader)
	waitLeads(t, next)
	if ok, cur := next.Log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("a second consumer's claim on the new leader = %v %q, want refused naming c1", ok, cur)
	}
	// The holder keeps it once its node reaches the new leader again, and
	// a claim from a third node is refused too.
	fnet.Heal(far.Node.ID(), next.Node.ID())
	eventually(t, "the holder's claim decided again", func() bool {
		ok, _ := far.Log.Route("s/x").Claim("g/y", "c1")
		return ok
	})
	if ok, cur := next.Log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("after healing, a second consumer's claim = %v %q, want refused naming c1", ok, cur)
	}
}

// TestLog_UnclaimWhileLeaderUnreachable: a holder gives its group up
// while its node cannot reach the stream's leader; once it can, the
// release lands and another consumer takes the group, with the holder's
// node alive throughout.
func TestLog_UnclaimWhileLeaderUnreachable(t *testing.T) {
	fnet, leader, next, far, _ := claimSite(t)
	if ok, cur := far.Log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("first claim refused, naming %q", cur)
	}
	isolate(fnet, far, leader)
	far.Log.Route("s/x").Unclaim("g/y", "c1")
	if ok, cur := next.Log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("while the release cannot reach the leader: claim = %v %q, want refused naming c1", ok, cur)
	}
	fnet.Heal(far.Node.ID(), leader.Node.ID())
	eventually(t, "another consumer takes the group once the release reached the leader", func() bool {
		ok, _ := next.Log.Route("s/x").Claim("g/y", "c2")
		return ok
	})
	// The holder's node does not take it back by itself.
	if ok, cur := leader.Log.Route("s/x").Claim("g/y", "c3"); ok || cur != "c2" {
		t.Fatalf("claim on the leader = %v %q, want refused naming c2", ok, cur)
	}
}

// TestLog_ClaimOfDeadLeadersClient: the group's consumer is a client of
// the stream's leader; the leader dies; once the site has it failed,
// a consumer on another node takes the group from the new leader, which
// found the dead node's claim in the replicated state.
func TestLog_ClaimOfDeadLeadersClient(t *testing.T) {
	_, leader, next, far, kill := claimSite(t)
	if ok, cur := leader.Log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("first claim refused, naming %q", cur)
	}
	// The claim is in every replica's state (answered once the ISR held it).
	for _, ln := range []*testNode{next, far} {
		h, ok, err := ln.Log.Stream("s").(*stream).claims.load("g/y")
		if err != nil || !ok || h.holder != "c1" || h.node != leader.Node.ID() {
			t.Fatalf("%s holds claim %+v %v %v, want c1 of %s", ln.Node.ID(), h, ok, err, leader.Node.ID())
		}
	}
	kill(leader)
	waitLeads(t, next)
	eventually(t, "a consumer on another node takes the dead node's group", func() bool {
		ok, _ := far.Log.Route("s/x").Claim("g/y", "c2")
		return ok
	})
}

// TestLog_ClaimRepair: a claim in the state naming a client of a live
// node that does not hold it (a claim written, but never answered, before
// its leader died) is released by that node, and the group can be
// claimed again.
func TestLog_ClaimRepair(t *testing.T) {
	_, leader, next, far, _ := claimSite(t)
	ls := leader.Log.Stream("s").(*stream)
	ghost := claimHolder{holder: "ghost", node: far.Node.ID(), epoch: far.Node.Epoch()}
	if err := ls.rs.write(context.Background(), ls.leading(), map[string][]byte{claimStateKey("g/y"): ghost.encode()}, nil, waitISR); err != nil {
		t.Fatalf("write the claim: %v", err)
	}
	if ok, cur := next.Log.Route("s/x").Claim("g/y", "c2"); ok || cur != "ghost" {
		t.Fatalf("claim = %v %q, want refused naming ghost", ok, cur)
	}
	eventually(t, "the ghost's node releases it", func() bool {
		ok, _ := next.Log.Route("s/x").Claim("g/y", "c2")
		return ok
	})
}

// TestLog_LateReleaseFromOldNode: a consumer moves to another node and
// claims its group there; the release its old connection sends later
// does not free the group it now holds.
func TestLog_LateReleaseFromOldNode(t *testing.T) {
	_, leader, next, far, _ := claimSite(t)
	if ok, cur := far.Log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("claim on %s refused, naming %q", far.Node.ID(), cur)
	}
	if ok, cur := next.Log.Route("s/x").Claim("g/y", "c1"); !ok {
		t.Fatalf("the same client's claim on %s refused, naming %q", next.Node.ID(), cur)
	}
	far.Log.Route("s/x").Unclaim("g/y", "c1")
	if ok, cur := leader.Log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("after the old node's release: claim = %v %q, want refused naming c1", ok, cur)
	}
}

// TestLog_ClaimKeysHidden: the claims a stream's state holds are not
// consumer state: mqtt neither sees nor writes them.
func TestLog_ClaimKeysHidden(t *testing.T) {
	_, leader, _, far, _ := claimSite(t)
	s := far.Log.Route("s/x")
	if ok, _ := s.Claim("g/y", "c1"); !ok {
		t.Fatal("claim refused")
	}
	if err := s.WriteState(map[string][]byte{"g/y": offsetVal(3)}, nil); err != nil {
		t.Fatalf("WriteState: %v", err)
	}
	for _, ln := range []*testNode{leader, far} {
		var keys []string
		if err := ln.Log.Route("s/x").LoadState("", func(k string, _ []byte) error {
			keys = append(keys, k)
			return nil
		}); err != nil {
			t.Fatalf("LoadState: %v", err)
		}
		if len(keys) != 1 || keys[0] != "g/y" {
			t.Fatalf("%s: LoadState(\"\") = %q, want only g/y", ln.Node.ID(), keys)
		}
	}
	if err := s.WriteState(nil, []string{claimStateKey("g/y")}); err == nil {
		t.Fatal("WriteState deleted a claim")
	}
	if ok, cur := leader.Log.Route("s/x").Claim("g/y", "c2"); ok || cur != "c1" {
		t.Fatalf("claim = %v %q, want refused naming c1", ok, cur)
	}
}

// FuzzDecodeClaim: a claim's value read from the state (a peer wrote it)
// never panics, and what encode writes decodes to itself.
func FuzzDecodeClaim(f *testing.F) {
	f.Add(claimHolder{holder: "c1", node: "n1", epoch: 7}.encode())
	f.Add(claimHolder{}.encode())
	f.Add([]byte{claimVersion, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeClaim(b)
		if err != nil {
			return
		}
		if got, err := decodeClaim(h.encode()); err != nil || got != h {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", h, got, err)
		}
	})
}
