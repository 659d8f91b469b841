package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/mqtt"
)

// Consumer state (group offsets, sessions) and claims when a stream's
// leader is cut off from the site: the leader refuses them, and gives
// up those waiting, as it does appends.

// TestSite_StateWriteOnACutOffLeaderIsGivenUpAtTheCutOff: a group
// offset or session written on a leader cut off from the site cannot be
// held by its ISR. Taken once the leader cannot commit but before the
// node counts as cut off, it is given up at the cut-off (as an append
// is), not after the 15 s a state write may wait for its ISR, nor a session after it
// was taken; taken after, it is refused at once. One node's state is
// written by one writer (mqtt's), so a wait here held every group and
// session of the node.
func TestSite_StateWriteOnACutOffLeaderIsGivenUpAtTheCutOff(t *testing.T) {
	const session = 8 * time.Second // cut off 6 s after the last contact
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2, SessionTimeout: session})
	s := leader.Log.Stream("s")
	if err := s.WriteState(map[string][]byte{"g": []byte("1")}, nil); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	for _, o := range others {
		cutFrom(fnet, leader, o, false)
	}
	eventually(t, leader.Node.ID()+" to stop hearing the controller", func() bool { return !leader.Node.HearsController() })
	if leader.Node.CutOff() {
		t.Fatalf("cut off %v after the cut; want not yet", time.Since(cutAt).Round(time.Millisecond))
	}
	took := time.Now()
	err := s.WriteState(map[string][]byte{"g": []byte("2")}, nil)
	waited, sinceCut := time.Since(took), time.Since(cutAt)
	if rf, ok := errors.AsType[*mqtt.Refusal](err); !ok || !errors.Is(err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("state write on the cut-off leader: %v; want a refusal, leader unavailable", err)
	} else {
		t.Logf("given up %v after it was taken, %v after the cut: %s", waited.Round(time.Millisecond),
			sinceCut.Round(time.Millisecond), rf.Reason)
	}
	if sinceCut >= session {
		t.Errorf("given up %v after the cut, %v after it was taken; want at the node's cut-off (%v after the last contact)",
			sinceCut.Round(time.Millisecond), waited.Round(time.Millisecond), session*3/4)
	}

	if !leader.Node.CutOff() {
		t.Fatal("not cut off after the write was given up")
	}
	took = time.Now()
	err = s.WriteState(map[string][]byte{"g": []byte("3")}, nil)
	if !errors.Is(err, mqtt.ErrLeaderUnavailable) {
		t.Fatalf("state write on the cut-off node: %v; want leader unavailable", err)
	}
	if d := time.Since(took); d > time.Second {
		t.Errorf("a state write on the cut-off node was refused after %v; want at once", d.Round(time.Millisecond))
	}
}

// A follower's state write or claim is forwarded to the stream's leader.
// When that leader is cut off with the request on its way, neither the
// request nor an answer crosses the cut; the controller fences the
// leader and moves the stream within the session timeout, and the
// follower sends the request again to the new leader instead of waiting
// out the 15 s a forwarded call may take. (Without it both tests took
// 16 s and ended refused.)

// cutLeaderWithRequestOpen isolates the stream's leader from the two
// other nodes after first sends one request through far, so that far's
// connection to the leader is open at the cut (the request then goes
// into the cut rather than failing to dial); it heals at cleanup.
func cutLeaderWithRequestOpen(t *testing.T, fnet *faultnet.Network, leader *testNode, others []*testNode, first func() error) time.Time {
	t.Helper()
	if err := first(); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	for _, o := range others {
		cutFrom(fnet, leader, o, false)
	}
	t.Cleanup(func() {
		for _, o := range others {
			cutFrom(fnet, leader, o, true)
		}
	})
	return time.Now()
}

func TestSite_ForwardedStateWriteFollowsTheNewLeader(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2})
	far := others[1]
	s := far.Log.Stream("s")
	cutAt := cutLeaderWithRequestOpen(t, fnet, leader, others, func() error {
		return s.WriteState(map[string][]byte{"g": []byte("1")}, nil)
	})
	if err := s.WriteState(map[string][]byte{"g": []byte("2")}, nil); err != nil {
		t.Fatalf("state write through %s %v after its leader was cut off: %v; want it written by the next leader",
			far.Node.ID(), time.Since(cutAt).Round(time.Millisecond), err)
	}
	took := time.Since(cutAt)
	st := streamState(others[0].Node)
	if st.Leader == leader.Node.ID() {
		t.Fatalf("written, but %s still leads the stream", st.Leader)
	}
	t.Logf("written %v after the cut; %s leads now", took.Round(time.Millisecond), st.Leader)
	for _, ln := range others {
		if ln.Node.ID() != st.Leader {
			continue
		}
		if got := string(loadKey(t, ln.Log.Stream("s"), "g")); got != "2" {
			t.Fatalf("the new leader %s holds g=%q; want 2", st.Leader, got)
		}
	}
}

func TestSite_ForwardedClaimFollowsTheNewLeader(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2})
	far := others[1]
	s := far.Log.Stream("s").(*stream)
	cutAt := cutLeaderWithRequestOpen(t, fnet, leader, others, func() error {
		if ok, cur := s.Claim("g1", "a"); !ok {
			return fmt.Errorf("claim of g1 refused (held by %q)", cur)
		}
		return nil
	})
	ok, cur := s.Claim("g2", "b")
	took := time.Since(cutAt)
	if !ok {
		t.Fatalf("claim through %s %v after its leader was cut off: not granted (holder %q); want it granted by the next leader",
			far.Node.ID(), took.Round(time.Millisecond), cur)
	}
	st := streamState(others[0].Node)
	if st.Leader == leader.Node.ID() {
		t.Fatalf("granted, but %s still leads the stream", st.Leader)
	}
	t.Logf("granted %v after the cut; %s leads now", took.Round(time.Millisecond), st.Leader)
	// The new leader decides from its state: another holder is refused.
	if ok, cur := far.Log.Stream("s").(*stream).Claim("g2", "c"); ok || cur != "b" {
		t.Fatalf("claim of g2 by another holder: granted %v, holder %q; want refused, held by b", ok, cur)
	}
}

// TestSite_ClaimAndStateWriteRefusedByADeposedLeaderFollowTheNewOne:
// the controller moves a stream while its entry reaches one follower
// late (its Raft link delayed 500 ms). The old leader knows at once
// and answers that follower's claim and state write "not the leader";
// the follower sends them on to the new leader once its own state names
// it, rather than refusing its client for a moment's lag.
func TestSite_ClaimAndStateWriteRefusedByADeposedLeaderFollowTheNewOne(t *testing.T) {
	fnet := faultnet.New()
	leader, others, _ := fwdSite(t, siteOpts{Net: fnet, MinISR: 2})
	ctl, far := others[0], others[1]
	s := far.Log.Stream("s").(*stream)
	if ok, cur := s.Claim("g1", "a"); !ok { // the claim connection to the leader is open
		t.Fatalf("claim of g1 refused (held by %q)", cur)
	}
	if err := s.WriteState(map[string][]byte{"g": []byte("1")}, nil); err != nil {
		t.Fatal(err)
	}
	epoch := streamState(ctl.Node).LeaderEpoch
	fnet.Delay(ctl.Node.ID(), far.Node.ID()+"/raft", 500*time.Millisecond)
	t.Cleanup(func() { fnet.Delay(ctl.Node.ID(), far.Node.ID()+"/raft", 0) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ctl.Node.Apply(ctx, rules.ElectLeader{Name: "s", Preferred: ctl.Node.ID()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, leader.Node.ID()+" to know it was deposed", func() bool { return streamState(leader.Node).LeaderEpoch > epoch })
	if id, e := s.stateLeaderID(); id != leader.Node.ID() || e != epoch {
		t.Fatalf("%s already has the new leader (%s in %d): the delay did not hold its state back", far.Node.ID(), id, e)
	}
	ok, cur := s.Claim("g2", "b")
	if !ok {
		t.Fatalf("claim through %s while its state lagged: not granted (holder %q); want it granted by the new leader", far.Node.ID(), cur)
	}
	if id, _ := s.stateLeaderID(); id != ctl.Node.ID() {
		t.Fatalf("granted, but %s names %s the leader", far.Node.ID(), id)
	}

	// Again for a state write, the stream moving back.
	epoch = streamState(ctl.Node).LeaderEpoch
	if err := ctl.Node.Apply(ctx, rules.ElectLeader{Name: "s", Preferred: leader.Node.ID()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctl.Node.ID()+" to know it was deposed", func() bool { return ctl.Log.Stream("s").(*stream).leading() == nil })
	if id, e := s.stateLeaderID(); id != ctl.Node.ID() || e != epoch {
		t.Fatalf("%s already has the new leader (%s in %d): the delay did not hold its state back", far.Node.ID(), id, e)
	}
	if err := s.WriteState(map[string][]byte{"g": []byte("2")}, nil); err != nil {
		t.Fatalf("state write through %s while its state lagged: %v; want it written by the new leader", far.Node.ID(), err)
	}
	if got := string(loadKey(t, leader.Log.Stream("s"), "g")); got != "2" {
		t.Fatalf("the new leader %s holds g=%q; want 2", leader.Node.ID(), got)
	}
}
