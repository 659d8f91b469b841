package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/mqtt"
)

// onlyS makes stream "s" acks: leader (siteOpts.AcksLeaderFor).
func onlyS(stream string) bool { return stream == "s" }

// produceOn runs a producer on s until the test ends or it is ended.
func produceOn(t *testing.T, s mqtt.Stream) *producer {
	p := produceOnto(func() mqtt.Stream { return s })
	t.Cleanup(func() { p.end() })
	return p
}

// TestLog_HandOverKeepsAcksLeaderRecords: on an acks: leader stream whose
// followers fetch slowly, the leader acknowledges records they do not
// hold yet; a graceful stop of the leader (the hand-over, then close)
// still leaves every acknowledged record on the new leader at the offset
// it was acknowledged with, and appends meanwhile are refused as while
// leadership moves (ErrLeaderUnavailable), not acknowledged and lost.
func TestLog_HandOverKeepsAcksLeaderRecords(t *testing.T) {
	fnet := faultnet.New()
	leader, others, kill := fwdSite(t, siteOpts{MinISR: 2, AcksLeaderFor: onlyS, Net: fnet})
	for _, f := range others {
		fnet.Delay(f.Node.ID(), leader.Node.ID(), 300*time.Millisecond)
	}
	p := produceOn(t, leader.Log.Route("s/x"))
	ls := leader.store.Stream("s")
	eventually(t, "the leader acknowledges records no follower holds yet", func() bool {
		end := ls.NextOffset()
		for _, f := range others {
			if f.store.Stream("s").NextOffset() >= end {
				return false
			}
		}
		return p.count() > 50
	})

	leader.HandOver(handOverTimeout)
	p.end()
	kill(leader)

	holdsAcked(t, others, p)
	if p.refused == 0 {
		t.Errorf("no append was refused while the leader handed over")
	}
	t.Logf("%d acknowledged, %d refused during the hand-over", len(p.acked), p.refused)
}

// holdsAcked waits until the controller names one of others, the old
// leader's followers, to lead "s", then checks that the new leader holds
// every record p had acknowledged, at its offset, and commits them.
func holdsAcked(t *testing.T, others []*testNode, p *producer) (next *testNode) {
	t.Helper()
	eventually(t, "a follower elected and leading", func() bool {
		st, _ := others[0].Node.State()
		for _, ln := range others {
			if st.Streams["s"].Leader == ln.Node.ID() {
				next = ln
			}
		}
		return next != nil && next.Log.Stream("s").(*stream).leading() != nil
	})
	var top uint64
	for off := range p.acked {
		top = max(top, off+1)
	}
	ns := next.store.Stream("s")
	if end := ns.NextOffset(); end < top {
		t.Fatalf("the new leader %s's log ends at %d: %d acknowledged records up to offset %d lost", next.Node.ID(), end, top-end, top)
	}
	eventually(t, "the new leader commits every acknowledged record", func() bool { return ns.Committed() >= top })
	recs, err := ns.Read(0, int(top), 0)
	if err != nil || uint64(len(recs)) < top {
		t.Fatalf("the new leader reads %d of %d records: %v", len(recs), top, err)
	}
	for off, payload := range p.acked {
		if got := string(recs[off].Payload); got != payload {
			t.Fatalf("offset %d: the new leader holds %s, %s was acknowledged there", off, got, payload)
		}
	}
	return next
}

// TestLog_HandOverElectsAFollowerHoldingEveryRecord: when one ISR
// follower has stopped fetching (it stays in the ISR for
// replica_lag_max) and comes first in replica order, the hand-over waits
// for it only so long, then shrinks the ISR to the follower that holds
// everything, which the controller elects: no acknowledged record is
// lost.
func TestLog_HandOverElectsAFollowerHoldingEveryRecord(t *testing.T) {
	fnet := faultnet.New()
	leader, stuck, ctl, kill := acksLeaderSite(t, fnet)
	fnet.Cut(stuck.Node.ID(), leader.Node.ID()) // its fetches no longer arrive
	p := produceOn(t, leader.Log.Route("s/x"))
	eventually(t, "the leader acknowledges records the stuck follower lacks", func() bool {
		return leader.store.Stream("s").NextOffset() > stuck.store.Stream("s").NextOffset() && p.count() > 50
	})
	if st, _ := leader.Node.State(); !st.Streams["s"].InISR(stuck.Node.ID()) {
		t.Fatalf("the stuck follower left the ISR before the hand-over (ISR %v): the test shows nothing", st.Streams["s"].ISR)
	}

	leader.HandOver(handOverTimeout)
	p.end()
	kill(leader)
	holdsAcked(t, []*testNode{ctl, stuck}, p)
}

// acksLeaderSite starts three nodes with stream "s" acks: leader and
// min_insync_replicas 2, on replicas leader, next, ctl in that order: next
// is elected after the leader, and is not the controller, so the
// controller's commands do not travel next's links. It waits until the ISR
// holds all three.
func acksLeaderSite(t *testing.T, fnet *faultnet.Network) (leader, next, ctl *testNode, kill func(*testNode)) {
	t.Helper()
	nodes, kill := startLogSite(t, siteOpts{MinISR: 2, AcksLeaderFor: onlyS, Net: fnet})
	ctl, rest := roles(t, nodes)
	leader, next = rest[0], rest[1]
	replicas := []string{leader.Node.ID(), next.Node.ID(), ctl.Node.ID()}
	for _, ln := range nodes {
		createStreams(t, ln, replicas, "s")
	}
	eventually(t, "every replica in the ISR", func() bool {
		st, _ := leader.Node.State()
		return len(st.Streams["s"].ISR) == 3
	})
	return leader, next, ctl, kill
}

// TestLog_HandOverKeepsAcksLeaderState: a group offset written on the
// leader of an acks: leader stream is answered before any follower holds
// it; a graceful stop of the leader right after still leaves it in the
// new leader's state.
func TestLog_HandOverKeepsAcksLeaderState(t *testing.T) {
	fnet := faultnet.New()
	leader, next, ctl, kill := acksLeaderSite(t, fnet)
	ls := leader.Log.Route("s/x")
	if _, err := logAppend(t, ls, logRecs(3, "r")...); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*testNode{next, ctl} {
		committedRecs(t, f.Node.ID(), f.Log.Route("s/x"), 3) // the records are not what lags here
	}
	fnet.Delay(leader.Node.ID(), next.Node.ID(), 300*time.Millisecond)
	fnet.Delay(next.Node.ID(), leader.Node.ID(), 300*time.Millisecond)
	if err := ls.WriteState(map[string][]byte{"g/last": offsetVal(2)}, nil); err != nil {
		t.Fatalf("WriteState on the leader: %v", err)
	}
	leader.HandOver(handOverTimeout)
	kill(leader)
	got := holdsAcked(t, []*testNode{next, ctl}, &producer{})
	if v := loadKey(t, got.Log.Route("s/x"), "g/last"); string(v) != string(offsetVal(2)) {
		t.Fatalf("the new leader %s's g/last = %x, want %x: an answered state write was lost", got.Node.ID(), v, offsetVal(2))
	}
}

// TestLeader_DrainWaitsForTheISRAndResumes: Drain refuses appends at
// once, waits for an ISR follower that has not fetched the leader's end
// (giving up when its context ends), returns once the follower fetched
// it, and Resume takes appends again.
func TestLeader_DrainWaitsForTheISRAndResumes(t *testing.T) {
	ls := openReplica(t)
	l := NewLeader("L", ls, 1, []string{"L", "F"}, nil)
	t.Cleanup(l.Close)
	appendRecs(t, ls, 5, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if l.Drain(ctx) {
		t.Fatal("drained with a follower that never fetched")
	}
	if l.beginAppend() {
		t.Fatal("an append admitted while draining")
	}
	done := make(chan bool, 1)
	go func() { done <- l.Drain(context.Background()) }()
	resp := l.fetch(context.Background(), &wire.FetchRequest{Stream: ls.Name(), ReplicaID: "F", BrokerEpoch: 1, LeaderEpoch: 1, Offset: 5})
	if resp.Code != wire.None {
		t.Fatalf("fetch at the leader's end: %v", resp.Code)
	}
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("Drain gave up with the follower at the leader's end")
		}
	case <-time.After(time.Minute):
		t.Fatal("Drain still waits after the follower fetched the leader's end")
	}
	l.Resume()
	if !l.beginAppend() {
		t.Fatal("an append refused after Resume")
	}
	l.endAppend()
}
