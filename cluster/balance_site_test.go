package cluster

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/rules"
)

func defaultStream(n *testNode) *rules.Stream {
	st, _ := n.Node.State()
	return st.Streams["default"]
}

// Changing replication_factor in a node's configuration and restarting
// it changes the stream: 2 -> 3 adds a replica that catches up, joins
// the ISR and holds every acknowledged record; 3 -> 2 drops one, never
// the leader, the ISR staying the two that remain. The other nodes,
// whose configuration still says 2 then 3, do not undo it (the node
// started last wins). Publishes are acknowledged throughout and none is
// lost.
func TestSite_ReplicationFactorChanges(t *testing.T) {
	nodes := newTestSite(t, siteOpts{RF: 2}).nodes
	var replicas []string
	eventually(t, "the default stream on two replicas, both in sync", func() bool {
		s := defaultStream(nodes[0])
		if s == nil || len(s.Replicas) != 2 || len(s.ISR) != 2 {
			return false
		}
		replicas = s.Replicas
		return true
	})
	// The node outside the stream is restarted with the new factor; the
	// producer uses another.
	var out int
	for i, n := range nodes {
		if !slices.Contains(replicas, n.Node.ID()) {
			out = i
		}
	}
	prod := nodes[(out+1)%3]
	p := produce(prod)
	p.moreAcked(t, "publishes acknowledged on two replicas", 50)

	nodes[out].stop(t)
	nodes[out].restart(t, SiteStream{Name: "default", ReplicationFactor: 3})
	streamIs(t, nodes, "n1", "n2", "n3")
	if s := defaultStream(prod); s.Want() != 3 {
		t.Fatalf("replication factor %d, want 3", s.Want())
	}
	p.moreAcked(t, "publishes acknowledged on three replicas", 50)
	holdsAll(t, nodes[out], p.snapshot())

	// Down again, from the producer's own node this time (a restart of
	// the node the producer uses would refuse its publishes meanwhile:
	// restart another one, the node that does not lead).
	leader := defaultStream(prod).Leader
	var back int
	for i, n := range nodes {
		if n != prod && n.Node.ID() != leader {
			back = i
			break
		}
	}
	nodes[back].stop(t)
	nodes[back].restart(t, SiteStream{Name: "default", ReplicationFactor: 2})
	var kept []string
	eventually(t, "the default stream back on two replicas, both in sync, on every node", func() bool {
		for _, n := range nodes {
			s := defaultStream(n)
			if s == nil || s.Want() != 2 || len(s.Replicas) != 2 || !slices.Equal(s.ISR, s.Replicas) {
				return false
			}
			kept = s.Replicas
		}
		return true
	})
	if s := defaultStream(prod); !slices.Contains(s.Replicas, s.Leader) {
		t.Fatalf("stream after the shrink: %+v", s)
	}
	p.moreAcked(t, "publishes acknowledged on two replicas again", 50)
	acked := p.end()
	for _, n := range nodes {
		if slices.Contains(kept, n.Node.ID()) {
			holdsAll(t, n, acked)
		}
	}
}

// snapshot copies what was acknowledged so far.
func (p *producer) snapshot() map[uint64]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[uint64]string, len(p.acked))
	for k, v := range p.acked {
		out[k] = v
	}
	return out
}

// watchReplicas records the smallest replica set the default stream had
// in n's state, sampled at every change, until stop is called.
func watchReplicas(n *testNode) (smallest func() int, stop func()) {
	var mu sync.Mutex
	least := 1 << 30
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			st, changed := n.Node.State()
			if s := st.Streams["default"]; s != nil {
				mu.Lock()
				least = min(least, len(s.Replicas))
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-changed:
			}
		}
	}()
	return func() int {
			mu.Lock()
			defer mu.Unlock()
			return least
		}, func() {
			close(done)
			wg.Wait()
		}
}

// A live node is decommissioned: remove-node drains it while it serves
// (its replica moves to the spare broker, its leadership to an in-sync
// replica; a controller hands the controller over first), it leaves
// Raft's voters, and once stopped it is removed and leaves Serf. The
// stream never has fewer than three replicas and publishes are
// acknowledged throughout, none lost.
func TestSite_RemoveLiveNode(t *testing.T) {
	// In-process, n1 bootstraps and leads: the leader is usually the
	// controller too.
	t.Run("the leader", func(t *testing.T) { testRemoveLiveNode(t, true) })
	t.Run("a follower", func(t *testing.T) { testRemoveLiveNode(t, false) })
}

// threeVotersAndSpare starts three voters and a fourth broker, n4, and
// waits until every node is registered and the default stream has a full
// ISR; ready, when not nil, must also hold of the stream (given the
// voters). It returns the voters, then n4.
func threeVotersAndSpare(t *testing.T, ready func(s *rules.Stream, voters []*testNode) bool) (all []*testNode) {
	t.Helper()
	site := newTestSite(t, siteOpts{RF: 3})
	nodes := slices.Clone(site.nodes)
	site.add("n4")
	all = site.nodes
	eventually(t, "the default stream with a full ISR and every node registered", func() bool {
		s := defaultStream(nodes[0])
		for _, n := range all {
			if !brokerAlive(nodes[0], n.Node.ID()) {
				return false
			}
		}
		return s != nil && len(s.ISR) == 3 && (ready == nil || ready(s, nodes))
	})
	return all
}

func testRemoveLiveNode(t *testing.T, ofLeader bool) {
	var leader string
	var replicas []string
	all := threeVotersAndSpare(t, func(s *rules.Stream, _ []*testNode) bool {
		leader, replicas = s.Leader, s.Replicas
		return true
	})
	var victim, prod, spare *testNode
	for _, n := range all {
		id := n.Node.ID()
		switch {
		case !slices.Contains(replicas, id):
			spare = n
		case ofLeader == (id == leader) && (ofLeader || !n.Node.IsController()):
			victim = n
		}
	}
	if victim == nil {
		t.Fatal("no node to drain")
	}
	for _, n := range all {
		if n != victim && n != spare {
			prod = n
		}
	}
	t.Logf("draining %s (leader %s, controller %s); producing on %s", victim.Node.ID(), leader,
		victim.Node.Controller(), prod.Node.ID())
	p := produce(prod)
	p.moreAcked(t, "publishes acknowledged before the drain", 50)
	smallest, stopWatch := watchReplicas(prod)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rm, err := spare.RemoveNode(ctx, victim.Node.ID())
	if err != nil {
		t.Fatalf("RemoveNode of a live node: %v", err)
	}
	rm.Moving = slices.DeleteFunc(rm.Moving, func(s string) bool { return s == SessionsStream }) // it moves too, wherever it is
	if !rm.Draining || !slices.Equal(rm.Moving, []string{"default"}) {
		t.Fatalf("removal %+v, want draining, moving [default]", rm)
	}
	var rest []*testNode
	var ids []string
	for _, n := range all {
		if n != victim {
			rest = append(rest, n)
			ids = append(ids, n.Node.ID())
		}
	}
	streamIs(t, all, ids...)
	eventually(t, "the drained node shown drained, out of the voters, serving", func() bool {
		for _, n := range all {
			voters, _, err := n.Node.Quorum()
			if err != nil || slices.Contains(voters, victim.Node.ID()) {
				return false
			}
		}
		for _, m := range prod.Status().Members {
			if m.ID == victim.Node.ID() {
				return m.Removal == "drained" && m.State == "alive"
			}
		}
		return false
	})
	p.moreAcked(t, "publishes acknowledged after the drain", 50)
	if got := smallest(); got < 3 {
		t.Fatalf("the stream had %d replicas during the drain", got)
	}
	// The drained node still serves its clients: its publishes are
	// forwarded to the new leader.
	q := produce(victim)
	q.moreAcked(t, "publishes acknowledged on the drained node", 10)
	drainedAcked := q.end()

	victim.stop(t)
	eventually(t, "the stopped node removed, out of Raft and Serf", func() bool {
		for _, n := range rest {
			st, _ := n.Node.State()
			if b := st.Brokers[victim.Node.ID()]; b == nil || !b.Removed {
				return false
			}
			voters, nonvoters, err := n.Node.Quorum()
			if err != nil || slices.Contains(voters, victim.Node.ID()) || slices.Contains(nonvoters, victim.Node.ID()) {
				return false
			}
			for _, m := range n.Node.Members() {
				if m.ID == victim.Node.ID() && m.Status == "failed" {
					return false
				}
			}
		}
		return true
	})
	stopWatch()
	p.moreAcked(t, "publishes acknowledged after the removal", 50)
	acked := p.end()
	for off, v := range drainedAcked {
		acked[off] = v
	}
	for _, n := range rest {
		holdsAll(t, n, acked)
	}
}

// remove-node refuses a live voter whose going would leave the quorum
// without a majority, and a live node whose streams have nowhere to go.
func TestSite_RemoveLiveNodeRefused(t *testing.T) {
	nodes := newTestSite(t, siteOpts{RF: 3}).nodes
	streamIs(t, nodes, "n1", "n2", "n3")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := nodes[0].RemoveNode(ctx, "n3"); err == nil || !errors.Is(err, ErrIneligibleReplica) {
		t.Fatalf("RemoveNode with nowhere to move to: %v, want ErrIneligibleReplica", err)
	}
	nodes[2].crash(t)
	eventually(t, "n3 seen failed", func() bool {
		for _, m := range nodes[0].Node.Members() {
			if m.ID == "n3" {
				return m.Status == "failed"
			}
		}
		return false
	})
	if _, err := nodes[0].RemoveNode(ctx, "n2"); err == nil || !errors.Is(err, ErrQuorum) {
		t.Fatalf("RemoveNode of a voter with another one down: %v, want ErrQuorum", err)
	}
}

// A node that restarts gets its preferred leadership back once it has
// been in the ISR for leader_balance_after, under acks=all and under
// acks=leader; publishes acknowledged across both leader changes are all
// there.
func TestSite_LeaderBalancing(t *testing.T) {
	t.Run("acks all", func(t *testing.T) { leaderBalancing(t, false) })
	// The controller leaves these alone: their leader moves them itself,
	// once it has drained them (Site.handOff).
	t.Run("acks leader", func(t *testing.T) { leaderBalancing(t, true) })
}

func leaderBalancing(t *testing.T, acksLeader bool) {
	nodes := newTestSite(t, siteOpts{RF: 3, LeaderBalanceAfter: 3 * time.Second, AcksLeader: acksLeader}).nodes
	streamIs(t, nodes, "n1", "n2", "n3")
	s := defaultStream(nodes[0])
	preferred := s.Replicas[0]
	if s.Leader != preferred {
		t.Fatalf("created with leader %s, not its first replica %s", s.Leader, preferred)
	}
	var i int
	for j, n := range nodes {
		if n.Node.ID() == preferred {
			i = j
		}
	}
	prod := nodes[(i+1)%3]
	p := produce(prod)
	p.moreAcked(t, "publishes acknowledged before the restart", 50)

	nodes[i].stop(t)
	eventually(t, "another leader", func() bool {
		s := defaultStream(prod)
		return s.Leader != "" && s.Leader != preferred
	})
	p.moreAcked(t, "publishes acknowledged under another leader", 50)
	epoch := defaultStream(prod).LeaderEpoch
	nodes[i].restart(t)
	eventually(t, preferred+" leading again, on every node", func() bool {
		for _, n := range nodes {
			s := defaultStream(n)
			if s == nil || s.Leader != preferred || s.LeaderEpoch <= epoch {
				return false
			}
		}
		return true
	})
	p.moreAcked(t, "publishes acknowledged under the preferred leader again", 50)
	acked := p.end()
	for _, n := range nodes {
		holdsAll(t, n, acked)
	}
}

// A drain is undone by keep-node: the drained node, still serving, stops
// draining and rejoins the voters; the replicas that moved stay moved. A
// removed node (drained, then stopped) cannot be kept.
func TestSite_KeepNodeEndsADrain(t *testing.T) {
	var victim *testNode
	all := threeVotersAndSpare(t, func(s *rules.Stream, voters []*testNode) bool {
		// A voter holding a replica, not the controller: of the three
		// replicas at least two are voters, at most one the controller.
		for _, n := range voters {
			if !n.Node.IsController() && slices.Contains(s.Replicas, n.Node.ID()) {
				victim = n
			}
		}
		return victim != nil
	})
	spare := all[3]
	id := victim.Node.ID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := spare.RemoveNode(ctx, id); err != nil {
		t.Fatalf("RemoveNode of a live node: %v", err)
	}
	removalOf := func(n *testNode) string {
		for _, m := range n.Status().Members {
			if m.ID == id {
				return m.Removal
			}
		}
		return "?"
	}
	eventually(t, id+" drained and out of the voters", func() bool {
		voters, _, err := spare.Node.Quorum()
		return err == nil && !slices.Contains(voters, id) && removalOf(spare) == "drained"
	})
	moved := defaultStream(spare).Replicas

	if err := spare.KeepNode(ctx, id); err != nil {
		t.Fatalf("KeepNode of a drained node: %v", err)
	}
	eventually(t, id+" no longer draining and a voter again, on every node", func() bool {
		for _, n := range all {
			voters, _, err := n.Node.Quorum()
			if err != nil || !slices.Contains(voters, id) || removalOf(n) != "" {
				return false
			}
		}
		return true
	})
	if got := defaultStream(spare).Replicas; !slices.Equal(got, moved) {
		t.Fatalf("replicas %v after keep-node, want them where the drain moved them: %v", got, moved)
	}
	if err := spare.KeepNode(ctx, "nobody"); !errors.Is(err, ErrUnknownBroker) {
		t.Fatalf("KeepNode of an unknown node: %v, want ErrUnknownBroker", err)
	}

	// A drain that ended in a removal cannot be undone.
	if _, err := spare.RemoveNode(ctx, id); err != nil {
		t.Fatalf("RemoveNode again: %v", err)
	}
	eventually(t, id+" drained again", func() bool { return removalOf(spare) == "drained" })
	victim.stop(t)
	eventually(t, id+" removed", func() bool {
		st, _ := spare.Node.State()
		b := st.Brokers[id]
		return b != nil && b.Removed
	})
	if err := spare.KeepNode(ctx, id); !errors.Is(err, ErrRemovedBroker) {
		t.Fatalf("KeepNode of a removed node: %v, want ErrRemovedBroker", err)
	}
}
