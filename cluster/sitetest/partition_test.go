package sitetest

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

var partitionRoundsFlag = flag.Int("sitetest.partition.rounds", 2, "rounds of each partition test (make test-partition: 5)")

// hold is how long a partition lasts: past failure detection (about
// 2.5 s) and replica_lag_max (10 s), so the ISR shrinks.
const hold = 12 * time.Second

// roundResult is what the producers saw in one fault round.
type roundResult struct {
	what string
	// majority and cut are the longest stalls (no acknowledgement and no
	// refusal) of a producer connected, when the fault began, to a node
	// outside and on the fault's cut side; majorityAck and cutAck the
	// longest times without an acknowledgement (refusals do not end
	// them: a side that refuses everything serves no one).
	majority, cut       time.Duration
	majorityAck, cutAck time.Duration
	// isr is heal to an ISR of every replica, that every running node
	// agrees on; acked is heal to the time every producer had an
	// acknowledgement again.
	isr, acked time.Duration
	acks       int // acknowledgements from the fault to the end of the round
}

// partition is one partition test: a site of namespaces under load.
type partition struct {
	t      *testing.T
	kind   string
	s      *site
	st     streamSpec
	l      *load
	rounds []roundResult
}

func newPartition(t *testing.T, kind string, voters int, streams ...streamSpec) *partition {
	t.Helper()
	needPartition(t, kind)
	if len(streams) == 0 {
		streams = []streamSpec{{"load", "load/#"}}
	}
	s := newSiteWith(t, siteOpts{voters: voters, netns: true}, streams...)
	return &partition{t: t, kind: kind, s: s, st: streams[0]}
}

// start starts the producers (two per node) on the stream p measures.
func (p *partition) start() {
	p.t.Helper()
	p.l = startLoad(p.t, p.s, p.kind+"-"+p.st.name, p.st.topic(), 2)
	p.l.waitResumed(time.Now().Add(-time.Hour), 50)
}

// steady waits until the stream's ISR is full, it has one leader every
// node follows, and every producer, sent back to its home node, was
// acknowledged there: a round starts from a healthy site with producers
// on every node.
func (p *partition) steady() {
	p.t.Helper()
	p.s.waitISRFull(p.st.name)
	p.s.leader(p.st.name)
	p.l.rehome()
	p.l.waitEveryAcked(time.Now())
}

// round runs one fault: fault starts it and returns when it is healed
// (the heal's time); cutSide are the nodes on its minority or cut side.
func (p *partition) round(n int, what string, cutSide []*node, fault func() time.Time) {
	p.t.Helper()
	p.steady()
	at := p.l.where()
	acksBefore := p.l.acks()
	faultAt := time.Now()
	healAt := fault()
	ackedAt := p.l.waitEveryAcked(healAt)
	isrAt := p.s.waitISRFull(p.st.name)
	r := roundResult{what: what, isr: isrAt.Sub(healAt), acked: ackedAt.Sub(healAt), acks: p.l.acks() - acksBefore}
	addrs := p.s.addrs()
	onCutSide := func(id string) bool {
		k, ok := at[id]
		return ok && slices.ContainsFunc(cutSide, func(nd *node) bool { return nd.mqtt == addrs[k] })
	}
	for id, d := range p.l.stalls(faultAt, ackedAt, false) {
		if onCutSide(id) {
			r.cut = max(r.cut, d)
		} else {
			r.majority = max(r.majority, d)
		}
	}
	for id, d := range p.l.stalls(faultAt, ackedAt, true) {
		if onCutSide(id) {
			r.cutAck = max(r.cutAck, d)
		} else {
			r.majorityAck = max(r.majorityAck, d)
		}
	}
	p.rounds = append(p.rounds, r)
	p.t.Logf("%s round %d: %s: longest stall %v on the majority side, %v on the cut side (without an acknowledgement: %v, %v); after the heal (%v after the fault): ISR full %v, every producer acknowledged %v; %d acknowledgements",
		p.kind, n, what, r.majority.Round(10*time.Millisecond), r.cut.Round(10*time.Millisecond),
		r.majorityAck.Round(10*time.Millisecond), r.cutAck.Round(10*time.Millisecond), healAt.Sub(faultAt).Round(10*time.Millisecond),
		r.isr.Round(10*time.Millisecond), r.acked.Round(10*time.Millisecond), r.acks)
}

// finish stops the load, runs the checks on the stream's replicas and
// reports the rounds.
func (p *partition) finish(others ...func() checked) {
	p.t.Helper()
	p.l.stop()
	p.t.Logf("producers: %s", p.l.summary())
	_, res := p.s.checkOn(p.st, p.s.replicas(p.st.name), p.l)
	for _, o := range others {
		r := o()
		res.lost += r.lost
		res.divergent += r.divergent
	}
	partitionReport(p.t, p.kind, p.rounds, p.l.acks(), res)
}

// sleepFor sleeps d and returns the time then: the heal's.
func sleepFor(d time.Duration) time.Time {
	time.Sleep(d)
	return time.Now()
}

// Leader isolated: the stream's leader is cut from both other nodes (its
// clients still reach it) for hold, then healed.
func TestPartition_LeaderIsolated(t *testing.T) {
	p := newPartition(t, "leader-isolated", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		ld := p.s.leader(p.st.name)
		p.round(n, "isolate "+p.s.describe(p.st.name, []*node{ld}), []*node{ld}, func() time.Time {
			p.s.isolate(ld)
			defer p.s.healAll()
			return sleepFor(hold)
		})
	}
	p.finish()
}

// Controller isolated: the Raft leader is cut from both other nodes for
// hold, then healed; the stream's leader may be it or another node.
func TestPartition_ControllerIsolated(t *testing.T) {
	p := newPartition(t, "controller-isolated", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		ctrl, ld := p.s.controller(), p.s.leader(p.st.name)
		what := "isolate " + ctrl.id + " (controller, a follower)"
		if ctrl == ld {
			what = "isolate " + ctrl.id + " (controller and leader)"
		}
		p.round(n, what, []*node{ctrl}, func() time.Time {
			p.s.isolate(ctrl)
			defer p.s.healAll()
			return sleepFor(hold)
		})
	}
	p.finish()
}

// Only the link between a stream's leader and the controller cut: Serf
// still sees every node alive through the third. Three streams whose
// leaders spread over the nodes; each round measures one whose leader is
// not the controller (its producers alone run).
func TestPartition_LeaderControllerLink(t *testing.T) {
	linkCut(t, "leader-controller-link", func(ld, ctrl, _ *node) (*node, string) {
		return ctrl, ctrl.id + " (controller)"
	})
}

// Only the link between a stream's leader and one follower cut, where
// the third node is the controller: both still reach it, so neither is
// fenced, and the follower's fetches stop arriving at the leader.
func TestPartition_LeaderFollowerLink(t *testing.T) {
	linkCut(t, "leader-follower-link", func(ld, _, third *node) (*node, string) {
		return third, third.id + " (a follower)"
	})
}

// linkCut runs the rounds of a test that cuts only the link between the
// leader of a stream not led by the controller and the node other picks
// (of the controller and the third node), for hold. Three streams whose
// leaders spread over the nodes; each round measures one such stream
// (its producers alone run).
func linkCut(t *testing.T, kind string, other func(ld, ctrl, third *node) (*node, string)) {
	streams := []streamSpec{{"cg", "cg/#"}, {"a", "a/#"}, {"c", "c/#"}}
	p := newPartition(t, kind, 3, streams...)
	loads := map[string]*load{}
	for n := 1; n <= *partitionRoundsFlag; n++ {
		var ld, ctrl *node
		testwait.EventuallyWithin(t, wait(2*time.Minute), "a stream not led by the controller", func() bool {
			ctrl = p.s.controller()
			for _, st := range streams {
				if l := p.s.leaderNow(st.name); l != nil && l != ctrl {
					p.st, ld = st, l
					return true
				}
			}
			return false
		})
		var third *node
		for _, nd := range p.s.nodes {
			if nd != ld && nd != ctrl {
				third = nd
			}
		}
		if loads[p.st.name] == nil {
			p.start()
			loads[p.st.name] = p.l
		}
		p.l = loads[p.st.name]
		to, what := other(ld, ctrl, third)
		p.round(n, fmt.Sprintf("cut %s (leader of %s) from %s", ld.id, p.st.name, what), []*node{ld, to}, func() time.Time {
			p.s.cut(ld, to)
			defer p.s.heal(ld, to)
			return sleepFor(hold)
		})
	}
	var last streamSpec = p.st
	var others []func() checked
	for _, st := range streams {
		if l := loads[st.name]; l != nil && st != last {
			others = append(others, func() checked {
				l.stop()
				_, res := p.s.checkOn(st, p.s.replicas(st.name), l)
				return res
			})
		}
	}
	p.finish(others...)
}

// A follower cut from both other nodes for 15 s, then healed.
func TestPartition_FollowerCut(t *testing.T) {
	p := newPartition(t, "follower-cut", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		f := p.s.follower(p.st.name, n)
		p.round(n, "cut "+p.s.describe(p.st.name, []*node{f})+" for 15s", []*node{f}, func() time.Time {
			p.s.isolate(f)
			defer p.s.healAll()
			return sleepFor(15 * time.Second)
		})
	}
	p.finish()
}

// A 2/1 split of three nodes; the node alone is each one in turn, so the
// leader is alone in a third of the rounds.
func TestPartition_Split3(t *testing.T) {
	p := newPartition(t, "split-2-1", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		alone := p.s.nodes[(n-1)%3]
		p.splitRound(n, []*node{alone})
	}
	p.finish()
}

// splitRound is round n of a split of the site into the nodes of small
// (the cut side) and the rest, for hold.
func (p *partition) splitRound(n int, small []*node) {
	p.t.Helper()
	big := slices.DeleteFunc(slices.Clone(p.s.nodes), func(nd *node) bool { return slices.Contains(small, nd) })
	p.round(n, fmt.Sprintf("split %s / %s", ids(big), p.s.describe(p.st.name, small)), small, func() time.Time {
		p.s.split(big, small)
		defer p.s.healAll()
		return sleepFor(hold)
	})
}

// A 3/2 split of five voters (three replicas of the stream on three of
// them): in odd rounds the leader is on the side of two; in rounds 2, 6...
// the controller (when it does not lead) and one replica are, so the side
// of three elects a controller while its producers try the other side;
// in the others two followers or non-replicas are.
func TestPartition_Split5(t *testing.T) {
	p := newPartition(t, "split-3-2", 5)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		ld, ctl := p.s.leader(p.st.name), p.s.controller()
		var two []*node
		switch {
		case n%2 == 1:
			two = append(two, ld)
		case n%4 == 2 && ctl != ld:
			two = append(two, ctl)
			replicas := p.s.replicas(p.st.name)
			if slices.Contains(replicas, ctl) { // then a non-replica: one replica on the small side
				i := slices.IndexFunc(p.s.nodes, func(nd *node) bool { return !slices.Contains(replicas, nd) })
				two = append(two, p.s.nodes[i])
			} else {
				two = append(two, p.s.follower(p.st.name, n))
			}
		}
		for k := range p.s.nodes {
			nd := p.s.nodes[(k+n)%len(p.s.nodes)]
			if len(two) < 2 && nd != ld && !slices.Contains(two, nd) {
				two = append(two, nd)
			}
		}
		p.splitRound(n, two)
	}
	p.finish()
}

// The leader's links flap: cut from both other nodes for 1-3 s, healed
// for 1-3 s, for about 20 s; measured from the first cut to the last
// heal.
func TestPartition_FlappingLeader(t *testing.T) {
	p := newPartition(t, "flapping-leader", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		ld := p.s.leader(p.st.name)
		flaps := 0
		p.round(n, "flap the links of "+p.s.describe(p.st.name, []*node{ld}), []*node{ld}, func() time.Time {
			end := time.Now().Add(20 * time.Second)
			for time.Now().Before(end) {
				p.s.isolate(ld)
				flaps++
				time.Sleep(time.Second + rand.N(2*time.Second))
				p.s.healAll()
				if time.Now().Before(end) {
					time.Sleep(time.Second + rand.N(2*time.Second))
				}
			}
			return time.Now()
		})
		t.Logf("flapping-leader round %d: %d cuts", n, flaps)
	}
	p.finish()
}

// SIGSTOP of the leader for 10 s, then SIGCONT: a process that hangs
// (a GC pause, a swapped-out Pi) rather than dies.
func TestPartition_LeaderStopped(t *testing.T) {
	p := newPartition(t, "leader-sigstop", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		ld := p.s.leader(p.st.name)
		p.round(n, "SIGSTOP "+p.s.describe(p.st.name, []*node{ld})+" for 10s", []*node{ld}, func() time.Time {
			ld.signal(syscall.SIGSTOP)
			defer ld.signal(syscall.SIGCONT)
			return sleepFor(10 * time.Second)
		})
	}
	p.finish()
}

// kill -9 during a partition: a follower is cut from both other nodes;
// after hold, in odd rounds that follower is killed, in even rounds the
// leader (then the third node, alone in sync, has no Raft quorum until
// the heal, and the cut follower must truncate what it lacks of it); 5 s
// later the cut is healed, and the killed node restarted.
func TestPartition_KillDuringCut(t *testing.T) {
	p := newPartition(t, "kill-during-cut", 3)
	p.start()
	for n := 1; n <= *partitionRoundsFlag; n++ {
		p.steady()
		ld := p.s.leader(p.st.name)
		f := p.s.follower(p.st.name, n)
		victim, what := f, "kill -9 it"
		if n%2 == 0 {
			victim, what = ld, "kill -9 "+p.s.describe(p.st.name, []*node{ld})
		}
		p.round(n, fmt.Sprintf("cut %s, %s, heal, restart", p.s.describe(p.st.name, []*node{f}), what), []*node{f}, func() time.Time {
			p.s.isolate(f)
			time.Sleep(hold)
			victim.kill()
			time.Sleep(5 * time.Second)
			p.s.healAll()
			healAt := time.Now()
			victim.start()
			return healAt
		})
		victim.waitServing()
	}
	p.finish()
}

func ids(nodes []*node) string {
	var out []string
	for _, nd := range nodes {
		out = append(out, nd.id)
	}
	return strings.Join(out, ",")
}

// describe is ids with each node's role in stream now (leader,
// controller).
func (s *site) describe(stream string, nodes []*node) string {
	ld := s.leaderNow(stream)
	var out []string
	for _, nd := range nodes {
		var roles []string
		if nd == ld {
			roles = append(roles, "leader")
		}
		nd.mu.Lock()
		if nd.mu.controller {
			roles = append(roles, "controller")
		}
		nd.mu.Unlock()
		if len(roles) > 0 {
			out = append(out, nd.id+" ("+strings.Join(roles, ", ")+")")
		} else {
			out = append(out, nd.id)
		}
	}
	return strings.Join(out, ",")
}

// follower is a replica of stream that does not lead it: of two, the
// first in odd rounds, the second in even ones.
func (s *site) follower(stream string, round int) *node {
	s.t.Helper()
	ld := s.leader(stream)
	var fs []*node
	for _, nd := range s.replicas(stream) {
		if nd != ld {
			fs = append(fs, nd)
		}
	}
	if len(fs) == 0 {
		s.t.Fatalf("%s has no follower", stream)
	}
	return fs[round%len(fs)]
}

// isrFull is whether every running node shows stream with a leader and
// an ISR of every replica in one version (a node cut off shows an old
// version until it hears of the changes it missed).
func (s *site) isrFull(stream string) bool {
	var version uint64
	first := true
	for _, nd := range s.nodes {
		if !nd.running() {
			continue
		}
		v, err := nd.view()
		if err != nil {
			return false
		}
		i := slices.IndexFunc(v.Streams, func(st streamView) bool {
			return st.Name == stream
		})
		if i < 0 {
			return false
		}
		st := v.Streams[i]
		if st.Leader == "" || len(st.Replicas) != st.ReplicationFactor || len(st.ISR) != len(st.Replicas) {
			return false
		}
		if !first && st.Version != version {
			return false
		}
		first, version = false, st.Version
	}
	return !first
}

// waitISRFull waits until isrFull and returns the time it was seen.
func (s *site) waitISRFull(stream string) time.Time {
	s.t.Helper()
	testwait.EventuallyWithin(s.t, wait(2*time.Minute), stream+"'s ISR of every replica on every node", func() bool { return s.isrFull(stream) })
	return time.Now()
}

// replicas are the nodes holding a replica of stream, as the first
// running node that answers shows them.
func (s *site) replicas(stream string) []*node {
	s.t.Helper()
	var out []*node
	testwait.EventuallyWithin(s.t, wait(time.Minute), stream+"'s replicas", func() bool {
		for _, nd := range s.nodes {
			if !nd.running() {
				continue
			}
			v, err := nd.view()
			if err != nil {
				continue
			}
			for _, st := range v.Streams {
				if st.Name == stream && len(st.Replicas) > 0 {
					out = nil
					for _, id := range st.Replicas {
						out = append(out, s.node(id))
					}
					return true
				}
			}
		}
		return false
	})
	return out
}

// where is the node (address index) each producer is connected to now.
func (l *load) where() map[string]int {
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	out := map[string]int{}
	for id, k := range l.ledger.mu.at {
		out[id] = k
	}
	return out
}

func (l *load) acks() int {
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	return l.ledger.mu.acks
}

// waitEveryAcked waits until every producer has an acknowledgement after
// since, and returns when the last of them had its first.
func (l *load) waitEveryAcked(since time.Time) time.Time {
	l.t.Helper()
	var last time.Time
	testwait.EventuallyWithin(l.t, wait(2*time.Minute), "an acknowledgement of every producer after "+since.Format("15:04:05.000"), func() bool {
		l.ledger.mu.Lock()
		defer l.ledger.mu.Unlock()
		last = since
		for _, as := range l.ledger.mu.answers {
			i := slices.IndexFunc(as, func(a answer) bool { return a.ack && a.at.After(since) })
			if i < 0 {
				return false
			}
			last = later(last, as[i].at)
		}
		return len(l.ledger.mu.answers) > 0
	})
	return last
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// stalls is each producer's longest time without an answer (an
// acknowledgement or a refusal; with acks, an acknowledgement) that ended
// after from, up to to.
func (l *load) stalls(from, to time.Time, acks bool) map[string]time.Duration {
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	out := map[string]time.Duration{}
	for id, as := range l.ledger.mu.answers {
		prev := from
		var longest time.Duration
		for _, a := range as {
			if acks && !a.ack {
				continue
			}
			if !a.at.After(from) {
				prev = a.at // the last answer before the fault
				continue
			}
			if a.at.After(to) {
				break
			}
			longest = max(longest, a.at.Sub(prev))
			prev = a.at
		}
		out[id] = max(longest, to.Sub(prev))
	}
	return out
}
