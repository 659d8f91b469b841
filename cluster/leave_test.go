package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/rules"
)

// TestLog_LeavingKeepsAcksLeaderRecords: decommissioning (DrainBroker)
// the leader of an acks: leader stream whose followers fetch slowly, or
// moving its replica away (MoveReplicas, a rebalance), while a producer
// publishes to it, leaves every record it acknowledged on the new leader
// at its offset once the replica has moved: the leader hands over after
// a drain, the controller does not elect at once.
func TestLog_LeavingKeepsAcksLeaderRecords(t *testing.T) {
	t.Run("drain", func(t *testing.T) {
		leaving(t, func(leader, spare string) rules.Command { return rules.DrainBroker{ID: leader} })
	})
	t.Run("rebalance", func(t *testing.T) {
		leaving(t, func(leader, spare string) rules.Command {
			return rules.MoveReplicas{Moves: []rules.StreamMove{{Stream: "s", From: leader, To: spare}}}
		})
	})
}

// leaving runs TestLog_LeavingKeepsAcksLeaderRecords with the command
// leave submits to take the leader's replica away.
func leaving(t *testing.T, leave func(leader, spare string) rules.Command) {
	fnet := faultnet.New()
	nodes, _ := startLogSite(t, siteOpts{Voters: 4, MinISR: 2, AcksLeaderFor: onlyS, Net: fnet})
	ctl, rest := roles(t, nodes)
	leader, next, spare := rest[0], rest[1], rest[2]
	for _, ln := range nodes {
		createStreams(t, ln, []string{leader.Node.ID(), next.Node.ID(), ctl.Node.ID()}, "s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// As a site sets it: without a factor, a drain would keep the added one.
	if err := ctl.Node.Submit(ctx, rules.SetReplicationFactor{Name: "s", ReplicationFactor: 3}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every replica in the ISR", func() bool {
		st, _ := leader.Node.State()
		return len(st.Streams["s"].ISR) == 3
	})
	for _, ln := range nodes {
		if ln != leader {
			fnet.Delay(ln.Node.ID(), leader.Node.ID(), 300*time.Millisecond)
		}
	}
	p := produceOn(t, leader.Log.Route("s/x"))
	eventually(t, "the leader acknowledges records no follower holds yet", func() bool {
		end := leader.store.Stream("s").NextOffset()
		return next.store.Stream("s").NextOffset() < end && ctl.store.Stream("s").NextOffset() < end && p.count() > 50
	})

	if err := ctl.Node.Submit(ctx, leave(leader.Node.ID(), spare.Node.ID())); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the leader's replica moved", func() bool {
		st, _ := ctl.Node.State()
		return !slices.Contains(st.Streams["s"].Replicas, leader.Node.ID())
	})
	p.end()
	holdsAcked(t, []*testNode{next, ctl, spare}, p)
	t.Logf("%d acknowledged, %d refused while it moved", len(p.acked), p.refused)
}
