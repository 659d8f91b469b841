package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// producer appends one record at a time to the default stream on a node
// until stopped, keeping what was acknowledged (offset -> payload) and
// counting refusals with ErrLeaderUnavailable.
type producer struct {
	mu      sync.Mutex
	acked   map[uint64]string
	refused int
	stop    chan struct{}
	done    chan struct{}
}

func produce(n *testNode) *producer { return produceTo(n, "default") }

// produceTo is produce to stream name.
func produceTo(n *testNode, name string) *producer {
	l := n.Log // this run's: a restart of n does not move the producer
	return produceOnto(func() mqtt.Stream { return l.Stream(name) })
}

// produceOnto is produce to the stream stream returns (nil: not yet).
func produceOnto(stream func() mqtt.Stream) *producer {
	p := &producer{acked: map[uint64]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			s := stream()
			if s == nil {
				continue
			}
			payload := fmt.Sprintf("m%d", i)
			ch := make(chan struct{})
			var off uint64
			var err error
			s.AppendAsync([]*logstore.Record{{Topic: "t/" + payload, QoS: 1, Payload: []byte(payload)}},
				func(first uint64, e error) { off, err = first, e; close(ch) })
			select {
			case <-ch:
			case <-p.stop:
				<-ch
				return
			}
			p.mu.Lock()
			switch {
			case err == nil:
				p.acked[off] = payload
			case errors.Is(err, mqtt.ErrLeaderUnavailable):
				p.refused++
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *producer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acked)
}

// end stops the producer and returns what was acknowledged; idempotent.
func (p *producer) end() map[uint64]string {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	return p.acked
}

// moreAcked waits until the producer has k more acknowledgements.
func (p *producer) moreAcked(t *testing.T, what string, k int) {
	t.Helper()
	from := p.count()
	eventually(t, what, func() bool { return p.count() >= from+k })
}

// holdsAll checks that every acknowledged record is committed on n's
// own replica, at the offset it was acknowledged with.
func holdsAll(t *testing.T, n *testNode, acked map[uint64]string) {
	t.Helper()
	holdsAllOf(t, n, "default", acked)
}

// holdsAllOf is holdsAll of stream name.
func holdsAllOf(t *testing.T, n *testNode, name string, acked map[uint64]string) {
	t.Helper()
	local := n.store.Stream(name)
	var top uint64
	for off := range acked {
		top = max(top, off+1)
	}
	eventually(t, n.Node.ID()+" commits every acknowledged record of "+name, func() bool { return local.Committed() >= top })
	for off, want := range acked {
		recs, err := local.Read(off, 1, 0)
		if err != nil || len(recs) != 1 || recs[0].Offset != off || string(recs[0].Payload) != want {
			t.Fatalf("%s: %s at offset %d: %v %v, want %q", n.Node.ID(), name, off, recs, err, want)
		}
	}
}

// streamIs waits until every node's state has the default stream on
// exactly replicas (in any order), all of them in the ISR, and a leader.
func streamIs(t *testing.T, nodes []*testNode, replicas ...string) {
	t.Helper()
	want := slices.Sorted(slices.Values(replicas))
	eventually(t, fmt.Sprintf("the default stream on %v, all in sync, on every node", want), func() bool {
		for _, n := range nodes {
			st, _ := n.Node.State()
			s := st.Streams["default"]
			if s == nil || s.Leader == "" || !slices.Equal(slices.Sorted(slices.Values(s.Replicas)), want) ||
				!slices.Equal(slices.Sorted(slices.Values(s.ISR)), want) {
				return false
			}
			// The sessions' stream moves too, wherever its replicas are.
			if ss := st.Streams[SessionsStream]; ss != nil && (ss.Leader == "" || len(ss.ISR) != len(ss.Replicas)) {
				return false
			}
		}
		return true
	})
}

func brokerAlive(n *testNode, id string) bool {
	st, _ := n.Node.State()
	b := st.Brokers[id]
	return b != nil && b.Alive
}

// A three-voter site with a spare broker: a replica's node dies for good
// and the operator removes it. The stream moves onto the spare, the ISR
// is full again, the dead voter leaves Raft and Serf, every acknowledged
// record is on the new replica, and publishes are acknowledged
// throughout.
func TestSite_RemoveDeadNode(t *testing.T) {
	site := newTestSite(t, siteOpts{RF: 3})
	site.add("n4")
	nodes, n1 := site.nodes, site.nodes[0]
	byID := map[string]*testNode{}
	for _, n := range nodes {
		byID[n.Node.ID()] = n
	}
	var replicas []string
	eventually(t, "the default stream with a full ISR and every node registered", func() bool {
		st, _ := n1.Node.State()
		s := st.Streams["default"]
		for _, n := range nodes {
			if !brokerAlive(n1, n.Node.ID()) {
				return false
			}
		}
		if s == nil || len(s.ISR) != 3 {
			return false
		}
		replicas = s.Replicas
		return true
	})
	var victim, spare *testNode
	for _, n := range nodes {
		switch id := n.Node.ID(); {
		case !slices.Contains(replicas, id):
			spare = n
		case victim == nil && n.cfg.Node.Voter && !n.Node.IsController():
			victim = n
		}
	}
	var alive []*testNode
	for _, n := range nodes {
		if n != victim {
			alive = append(alive, n)
		}
	}
	t.Logf("replicas %v: killing %s, %s is the spare", replicas, victim.Node.ID(), spare.Node.ID())

	// The producer uses a node that stays, and not the spare: its appends
	// are forwarded or led there, whatever moves.
	var prodNode *testNode
	for _, n := range alive {
		if n != spare {
			prodNode = n
		}
	}
	p := produce(prodNode)
	p.moreAcked(t, "publishes acknowledged before the kill", 50)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	victim.crash(t)
	eventually(t, "the victim counted failed", func() bool { return !brokerAlive(prodNode, victim.Node.ID()) })
	p.moreAcked(t, "publishes acknowledged with the victim dead", 50)

	rm, err := spare.RemoveNode(ctx, victim.Node.ID())
	if err != nil {
		t.Fatalf("RemoveNode: %v", err)
	}
	if rm.Moving = slices.DeleteFunc(rm.Moving, func(s string) bool { return s == SessionsStream }); !slices.Equal(rm.Moving, []string{"default"}) {
		t.Fatalf("removal moves %v, want [default]", rm.Moving)
	}
	var ids []string
	for _, n := range alive {
		ids = append(ids, n.Node.ID())
	}
	streamIs(t, alive, ids...)
	eventually(t, "the victim out of Raft's voters and out of Serf", func() bool {
		for _, n := range alive {
			voters, _, err := n.Node.Quorum()
			if err != nil || slices.Contains(voters, victim.Node.ID()) || len(voters) != 2 {
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
	for _, n := range alive {
		if st := n.Status(); !st.Ready || st.Streams[0].UnderReplicated {
			t.Fatalf("%s after the move: ready %v (%s), stream %+v", n.Node.ID(), st.Ready, st.NotReady, st.Streams[0])
		}
	}
	p.moreAcked(t, "publishes acknowledged after the move", 50)
	acked := p.end()
	for _, n := range alive {
		holdsAll(t, n, acked)
	}
}

// A stream of replication factor 3 created on a two-broker site gets its
// third replica when a third broker joins; with replace_after, a broker
// dead for longer is replaced by itself, and the stream grows back once
// a new broker joins.
func TestSite_StreamGrowsOntoJoiningBrokersAndReplaceAfter(t *testing.T) {
	const replaceAfter = 3 * time.Second
	site := newTestSite(t, siteOpts{Voters: 1, RF: 3, ReplaceAfter: replaceAfter})
	n1, n2 := site.nodes[0], site.add("n2")
	streamIs(t, []*testNode{n1, n2}, "n1", "n2")
	if st := n1.Status(); !st.Streams[0].UnderReplicated || st.Streams[0].ReplicationFactor != 3 {
		t.Fatalf("two replicas of three: %+v", st.Streams[0])
	}
	p := produce(n1)
	p.moreAcked(t, "publishes acknowledged on two replicas", 50)

	n3 := site.add("n3")
	streamIs(t, []*testNode{n1, n2, n3}, "n1", "n2", "n3")
	p.moreAcked(t, "publishes acknowledged on three replicas", 50)

	n2.crash(t)
	streamIs(t, []*testNode{n1, n3}, "n1", "n3")
	eventually(t, "n2 removed", func() bool {
		st, _ := n1.Node.State()
		return st.Brokers["n2"] != nil && st.Brokers["n2"].Removed
	})
	p.moreAcked(t, "publishes acknowledged after n2 was replaced", 50)

	n4 := site.add("n4")
	streamIs(t, []*testNode{n1, n3, n4}, "n1", "n3", "n4")
	if st := n4.Status(); !st.Ready || st.Streams[0].UnderReplicated {
		t.Fatalf("n4: ready %v (%s), stream %+v", st.Ready, st.NotReady, st.Streams[0])
	}
	p.moreAcked(t, "publishes acknowledged on the new replica set", 50)
	acked := p.end()
	for _, n := range []*testNode{n1, n3, n4} {
		holdsAll(t, n, acked)
	}
}
