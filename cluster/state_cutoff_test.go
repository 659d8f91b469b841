package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
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
