package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
)

// replicate starts a Replicator on every node of s (stopped before the
// node at cleanup, or by kill).
func (s *site) replicate(lagMax time.Duration, minISR int) {
	s.tb.Helper()
	s.reps = map[*Node]*Replicator{}
	for _, n := range s.nodes {
		st := s.stores[n]
		r := StartReplicator(ReplicatorConfig{Node: n, Server: s.servers[n], LagMax: lagMax, MinInsyncReplicas: minISR,
			FetchMaxWait: 200 * time.Millisecond, Log: n.log,
			Stream: func(name string) *logstore.Stream {
				if name != "s" {
					return nil
				}
				return st.Stream(name)
			}})
		s.reps[n] = r
		s.tb.Cleanup(r.Close)
	}
}

func (s *site) node(id string) *Node {
	for _, n := range s.nodes {
		if n.ID() == id {
			return n
		}
	}
	s.tb.Fatalf("no node %s", id)
	return nil
}

func (s *site) stream(n *Node) *logstore.Stream { return s.stores[n].Stream("s") }

// streamState is stream "s" as n's state has it.
func streamState(n *Node) *rules.Stream {
	st, _ := n.State()
	if s := st.Streams["s"]; s != nil {
		return s
	}
	return &rules.Stream{}
}

// createStream creates "s" on every node and waits until each knows.
func (s *site) createStream(live []*Node) *Node {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, len(live))
	for i, n := range live {
		ids[i] = n.ID()
	}
	if err := live[len(live)-1].Submit(ctx, rules.CreateStream{Name: "s", Replicas: ids}); err != nil {
		s.tb.Fatal(err)
	}
	for _, n := range live {
		eventually(s.tb, n.ID()+" knows the stream", func() bool { return streamState(n).Leader != "" })
	}
	return s.node(streamState(live[0]).Leader)
}

// converged waits until every node in live holds n records, all
// committed, and the same ones.
func (s *site) converged(live []*Node, n uint64) {
	s.tb.Helper()
	for _, m := range live {
		eventually(s.tb, m.ID()+" holds and commits every record", func() bool {
			st := s.stream(m)
			return st.NextOffset() == n && st.Committed() == n
		})
	}
	for _, m := range live[1:] {
		sameLog(s.tb, s.stream(live[0]), s.stream(m))
	}
}

func TestReplicator_FollowsTheStateThroughAFailover(t *testing.T) {
	s := startSite(t, partsOpts{Voters: 3, Serve: true})
	s.controller(s.nodes)
	s.registered(s.nodes)
	s.replicate(time.Minute, 0)
	leader := s.createStream(s.nodes)
	if epoch := streamState(leader).LeaderEpoch; epoch == 0 {
		t.Fatal("no leader epoch")
	}

	appendRecs(t, s.stream(leader), 50, "a")
	s.converged(s.nodes, 50)
	if e, _, _ := s.stream(s.nodes[0]).LatestEpoch(); e != streamState(leader).LeaderEpoch {
		t.Fatalf("records carry epoch %d, want the controller's leader epoch %d", e, streamState(leader).LeaderEpoch)
	}

	// The leader dies: the controller elects another from the ISR, whose
	// Replicator starts leading in the new epoch and the other follows it.
	s.kill(leader)
	live := without(s.nodes, leader)
	var next *Node
	eventually(t, "a new leader among the survivors", func() bool {
		st := streamState(live[0])
		if st.Leader == "" || st.Leader == leader.ID() {
			return false
		}
		next = s.node(st.Leader)
		return streamState(live[1]).Leader == next.ID()
	})
	eventually(t, "the new leader serves the stream", func() bool { return s.servers[next].leader("s") != nil })
	appendRecs(t, s.stream(next), 30, "b")
	// The dead member stays in the ISR until the controller's failure
	// report takes it out; then the two survivors commit.
	s.converged(live, 80)
	if e, _, _ := s.stream(live[0]).LatestEpoch(); e != streamState(next).LeaderEpoch {
		t.Fatalf("new records carry epoch %d, want %d", e, streamState(next).LeaderEpoch)
	}
}

func TestReplicator_StopsEverything(t *testing.T) {
	noLeak(t, func(t *testing.T) {
		s := startSite(t, partsOpts{Voters: 2, Net: faultnet.New()})
		s.controller(s.nodes)
		s.registered(s.nodes)
		s.replicate(time.Minute, 0)
		leader := s.createStream(s.nodes)
		eventually(t, "leading", func() bool { return s.servers[leader].leader("s") != nil })
		appendRecs(t, s.stream(leader), 3, "a")
		s.converged(s.nodes, 3) // a leader and a follower, with a fetch parked
		for _, n := range s.nodes {
			s.kill(n)
			if s.servers[n].leader("s") != nil {
				t.Fatal("still serving the stream after Close")
			}
		}
	})
}

func TestReplicator_ISRShrinksOnLagAndExpandsOnCatchUp(t *testing.T) {
	fnet := faultnet.New()
	s := startSite(t, partsOpts{Voters: 3, Net: fnet})
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	s.replicate(time.Second, 0)
	leader := s.createStream(s.nodes)
	var f *Node // a follower that is not the controller: the leader still reaches the controller
	for _, n := range s.nodes {
		if n != leader && n != ctl {
			f = n
		}
	}
	appendRecs(t, s.stream(leader), 20, "a")
	s.converged(s.nodes, 20)

	fnet.Partition(f.ID(), leader.ID())
	appendRecs(t, s.stream(leader), 20, "b")
	// The watermark waits for the lagging follower until the controller
	// has committed the ISR without it: whenever the leader's watermark
	// has moved, its own copy of the state already lacks the follower.
	eventually(t, "the leader commits without the partitioned follower", func() bool {
		committed := s.stream(leader).Committed()
		if committed > 20 && streamState(leader).InISR(f.ID()) {
			t.Fatalf("watermark %d with %s still in the committed ISR %v", committed, f.ID(), streamState(leader).ISR)
		}
		return committed == 40
	})
	if isr := streamState(ctl).ISR; len(isr) != 2 || slices.Contains(isr, f.ID()) {
		t.Fatalf("controller's ISR %v, want the two others", isr)
	}

	fnet.Heal(f.ID(), leader.ID())
	eventually(t, f.ID()+" rejoins the ISR after catching up", func() bool { return streamState(ctl).InISR(f.ID()) })
	appendRecs(t, s.stream(leader), 5, "c")
	s.converged(s.nodes, 45)
}

// partition cuts node a off from every other node of s: replication,
// commands and Raft (Serf still sees it alive, so nothing reports it
// failed: only an election deposes it).
func (s *site) partition(a *Node, heal bool) {
	for _, n := range s.nodes {
		if n == a {
			continue
		}
		for _, l := range [][2]string{{a.ID(), n.ID()}, {a.ID(), n.ID() + "/raft"}, {n.ID(), a.ID() + "/raft"}} {
			if heal {
				s.opts.Net.Heal(l[0], l[1])
			} else {
				s.opts.Net.Partition(l[0], l[1])
			}
		}
	}
}

func TestReplicator_DeposedLeaderNeverCommits(t *testing.T) {
	fnet := faultnet.New()
	s := startSite(t, partsOpts{Voters: 3, Net: fnet})
	s.controller(s.nodes)
	s.registered(s.nodes)
	s.replicate(time.Second, 2)
	old := s.createStream(s.nodes)
	appendRecs(t, s.stream(old), 10, "a")
	s.converged(s.nodes, 10)
	oldEpoch := streamState(old).LeaderEpoch

	// The leader is cut off from everyone; it still takes appends (a
	// client connected to it), which nobody fetches and which it can
	// never commit: its ISR cannot shrink without the controller.
	s.partition(old, false)
	appendRecs(t, s.stream(old), 10, "lost")
	rest := without(s.nodes, old)
	ctl := s.controller(rest)
	next := rest[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ctl.Submit(ctx, rules.ElectLeader{Name: "s", Preferred: next.ID()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new leader serves the stream", func() bool { return s.servers[next].leader("s") != nil })
	appendRecs(t, s.stream(next), 10, "new")
	// The new leader drops the unreachable old one from its ISR and
	// commits with the other follower.
	s.converged(rest, 20)
	if st := streamState(old); st.Leader != old.ID() || st.LeaderEpoch != oldEpoch {
		t.Fatalf("the partitioned node heard of the election (%+v): the test deposes nothing", st)
	}
	if c, end := s.stream(old).Committed(), s.stream(old).NextOffset(); c != 10 || end != 20 {
		t.Fatalf("deposed leader: watermark %d, log end %d; want 10 (nothing committed while cut off) and 20", c, end)
	}

	// Healed, it learns it was deposed, truncates to the new leader's
	// epoch end and follows: every replica holds the committed records.
	s.partition(old, true)
	eventually(t, "the old leader rejoins the ISR", func() bool { return streamState(ctl).InISR(old.ID()) })
	s.converged(s.nodes, 20)
	vals, err := s.stream(old).ReadRaw(10, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := s.stream(next).ReadRaw(10, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 10 || !slices.EqualFunc(vals, want, func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Fatal("the old leader kept records the new leader does not have")
	}
}

func TestLeader_MinInsyncReplicasHoldsTheWatermark(t *testing.T) {
	ls := openReplica(t)
	l := NewLeader("L", ls, 1, []string{"L"}, nil)
	t.Cleanup(l.Close)
	l.SetMinInsync(2)
	appendRecs(t, ls, 5, "a")
	if l.InSync() {
		t.Fatal("InSync with one member and min_insync_replicas 2")
	}
	// A lone leader (say, deposed and alone in its ISR) commits nothing.
	l.SetISR([]string{"L"})
	if c := ls.Committed(); c != 0 {
		t.Fatalf("watermark %d with the ISR below min_insync_replicas, want 0", c)
	}
	l.SetMinInsync(1)
	eventually(t, "committed once the minimum is met", func() bool { return ls.Committed() == 5 })
}

func TestReplicator_LeaderCutOffFromTheControllerStopsCommitting(t *testing.T) {
	fnet := faultnet.New()
	s := startSite(t, partsOpts{Voters: 3, Net: fnet})
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	s.replicate(time.Minute, 2)
	// The stream's leader is the first replica: make it a non-controller.
	replicas := []string{}
	for _, n := range s.nodes {
		if n != ctl {
			replicas = append(replicas, n.ID())
		}
	}
	replicas = append(replicas, ctl.ID())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ctl.Submit(ctx, rules.CreateStream{Name: "s", Replicas: replicas}); err != nil {
		t.Fatal(err)
	}
	l := s.node(replicas[0])
	eventually(t, l.ID()+" leads", func() bool { return s.servers[l].leader("s") != nil })
	appendRecs(t, s.stream(l), 10, "a")
	s.converged(s.nodes, 10)

	// Only its Raft links are cut: its followers still fetch from it, but
	// it cannot know whether the controller has moved on.
	for _, n := range s.nodes {
		if n != l {
			fnet.Partition(l.ID(), n.ID()+"/raft")
			fnet.Partition(n.ID(), l.ID()+"/raft")
		}
	}
	eventually(t, l.ID()+" has not heard from the controller for a heartbeat timeout", func() bool {
		return time.Since(l.raft.LastContact()) > 2*l.cfg.HeartbeatTimeout
	})
	appendRecs(t, s.stream(l), 10, "b")
	leader := s.servers[l].leader("s")
	eventually(t, "both followers fetched everything and told the leader", func() bool {
		pos, _ := leader.Positions()
		for _, id := range replicas[1:] {
			if r, ok := pos[id]; !ok || r.LogEnd != 20 {
				return false
			}
		}
		return true
	})
	if c := s.stream(l).Committed(); c != 10 {
		t.Fatalf("watermark %d while cut off from the controller, want 10", c)
	}
	for _, n := range s.nodes {
		if n != l {
			fnet.Heal(l.ID(), n.ID()+"/raft")
			fnet.Heal(n.ID(), l.ID()+"/raft")
		}
	}
	s.converged(s.nodes, 20)
}

// A restarted node's state, restored from a snapshot, can name it leader
// of a stream that has moved on since: it leads only once that state
// shows its current incarnation registered (everything before it
// applied), never from what predates it.
func TestReplicator_LeadsOnlyOnceItsIncarnationIsRegistered(t *testing.T) {
	s := startSite(t, partsOpts{Voters: 1, Net: faultnet.New()})
	n := s.controller(s.nodes)
	s.registered(s.nodes)
	s.replicate(time.Minute, 1)
	r := s.reps[n]
	state := func(brokerEpoch uint64) *rules.State {
		return &rules.State{
			Brokers: map[string]*rules.Broker{n.ID(): {ID: n.ID(), Epoch: brokerEpoch, Alive: true}},
			Streams: map[string]*rules.Stream{"s": {Name: "s", Replicas: []string{n.ID()}, ISR: []string{n.ID()}, Leader: n.ID(), LeaderEpoch: 4}},
		}
	}
	if ro := r.want(state(n.Epoch()-1), "s"); ro != nil {
		t.Fatalf("leads in epoch %d from a state that has the previous incarnation registered", ro.epoch)
	}
	if ro := r.want(&rules.State{Streams: state(n.Epoch()).Streams}, "s"); ro != nil {
		t.Fatalf("leads in epoch %d from a state that has no broker registered", ro.epoch)
	}
	if ro := r.want(state(n.Epoch()), "s"); ro == nil || !ro.leader || ro.epoch != 4 {
		t.Fatalf("role %+v from a state with this incarnation registered, want the leader in epoch 4", ro)
	}
}
