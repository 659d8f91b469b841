package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/rules"
)

// siteSettled reports whether every stream of st has a leader, its
// factor on replicas all in the ISR, and no move under way; and each of
// ids' replica count.
func siteSettled(st *rules.State, ids []string) (bool, map[string]int) {
	load := map[string]int{}
	for _, id := range ids {
		load[id] = 0
	}
	ok := true
	for _, x := range st.Streams {
		if x.Leader == "" || x.Moves != nil || len(x.Replicas) != x.Want() || len(x.ISR) != len(x.Replicas) {
			ok = false
		}
		for _, r := range x.Replicas {
			load[r]++
		}
	}
	return ok && len(load) == len(ids), load
}

// A three-voter site with streams of factor 3 and 2 grows to five
// nodes: the new ones hold nothing until a rebalance, which spreads the
// replicas (counts within one), every acknowledged record on every
// replica of its stream, publishes to every stream acknowledged (acks:
// all) throughout.
func TestSite_Rebalance(t *testing.T) {
	streams := []SiteStream{{Name: "default", ReplicationFactor: 3}, {Name: "s1", ReplicationFactor: 2},
		{Name: "s2", ReplicationFactor: 2}, {Name: "s3", ReplicationFactor: 2}}
	site := newTestSite(t, siteOpts{Streams: streams})
	nodes := slices.Clone(site.nodes)
	n1 := nodes[0]
	first := []string{"n1", "n2", "n3"}
	eventually(t, "every stream created, in sync, on n1-n3", func() bool {
		st, _ := n1.Node.State()
		ok, _ := siteSettled(st, first)
		return ok && len(st.Streams) == len(streams)+1 // and the sessions' stream
	})
	prods := map[string]*producer{}
	for i, x := range streams {
		prods[x.Name] = produceTo(nodes[i%3], x.Name)
	}
	moreAcked := func(when string, k int) {
		for name, p := range prods {
			p.moreAcked(t, fmt.Sprintf("publishes to %s acknowledged %s", name, when), k)
		}
	}
	moreAcked("on three nodes", 30)

	nodes = append(nodes, site.add("n4"), site.add("n5"))
	all := []string{"n1", "n2", "n3", "n4", "n5"}
	n5 := nodes[4]
	eventually(t, "n4 and n5 registered, as n5 sees the state", func() bool {
		return brokerAlive(n5, "n4") && brokerAlive(n5, "n5")
	})
	st, _ := n5.Node.State()
	if _, load := siteSettled(st, all); rules.Balanced(load) || load["n4"] != 0 || load["n5"] != 0 {
		t.Fatalf("before the rebalance: counts %v, want nothing on n4 and n5", load)
	}

	// Status on n1 shows the moves while they are under way.
	var shown atomic.Bool
	done := make(chan struct{})
	watched := make(chan struct{})
	stopWatching := sync.OnceFunc(func() {
		close(done)
		<-watched
	})
	t.Cleanup(stopWatching) // also when the test fails before it stops
	go func() {
		defer close(watched)
		for {
			st, changed := n1.Node.State()
			if slices.ContainsFunc(slices.Collect(maps.Values(st.Streams)), func(x *rules.Stream) bool { return x.Moves != nil }) &&
				slices.ContainsFunc(n1.Status().Streams, func(s StreamStatus) bool { return len(s.Moving) > 0 }) {
				shown.Store(true)
			}
			select {
			case <-done:
				return
			case <-changed:
			}
		}
	}()

	// From a node that is not the controller: the moves go through it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := n5.Rebalance(ctx)
	if err != nil {
		t.Fatalf("Rebalance: %v", err)
	}
	t.Logf("moves %v, counts after %v", r.Moves, r.Replicas)
	if len(r.Moves) == 0 || !r.Balanced || r.Replicas["n4"] == 0 || r.Replicas["n5"] == 0 {
		t.Fatalf("Rebalance: %+v", r)
	}
	moreAcked("during the rebalance", 20)

	var final *rules.State
	eventually(t, "every node sees the replicas spread within one, all in sync, no move left", func() bool {
		for _, n := range nodes {
			st, _ := n.Node.State()
			if ok, load := siteSettled(st, all); !ok || !rules.Balanced(load) {
				return false
			}
			final = st
		}
		return true
	})
	stopWatching()
	if !shown.Load() {
		t.Fatal("Status never showed a stream moving")
	}
	_, load := siteSettled(final, all)
	if load["n4"] == 0 || load["n5"] == 0 {
		t.Fatalf("counts %v", load)
	}
	t.Logf("counts after the rebalance %v", load)
	if again, err := n1.Rebalance(ctx); err != nil || len(again.Moves) != 0 || !again.Balanced {
		t.Fatalf("Rebalance again: %+v %v, want nothing to do", again, err)
	}

	moreAcked("after the rebalance", 30)
	byID := map[string]*testNode{}
	for _, n := range nodes {
		byID[n.Node.ID()] = n
	}
	for name, p := range prods {
		acked := p.end()
		for _, r := range final.Streams[name].Replicas {
			holdsAllOf(t, byID[r], name, acked)
		}
	}
}
