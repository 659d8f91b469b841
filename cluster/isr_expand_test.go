package cluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/faultnet"
	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
)

// replicaGate holds a Replicator's passes over the state while closed: the
// pass that hands a committed ISR to the Leader (sync's SetISR) comes
// late, as on a loaded node whose Replicator is busy ending and starting
// other streams' roles (a rebalance), while maintainISR keeps ticking.
type replicaGate struct{ ch atomic.Pointer[chan struct{}] }

func (g *replicaGate) hold() {
	ch := make(chan struct{})
	g.ch.Store(&ch)
}

func (g *replicaGate) release() {
	if p := g.ch.Swap(nil); p != nil {
		close(*p)
	}
}

func (g *replicaGate) wait() {
	if p := g.ch.Load(); p != nil {
		<-*p
	}
}

// A replica the controller took back into the ISR may be elected from
// then on, so the leader's watermark must count it from the moment it is
// proposed (Kafka's maximal ISR, KIP-497), until the Leader has the
// committed ISR: also while the node's state already holds the new ISR
// and the Replicator has not handed it to the Leader yet. Otherwise the
// leader acknowledges records the rejoined replica lacks, and when the
// controller elects it they are gone (TestSite_Rebalance once saw n1
// acknowledge m154, then n5, taken into the ISR, lead without it).
func TestReplicator_RejoinedReplicaHoldsTheWatermarkUntilTheLeaderHasTheISR(t *testing.T) {
	fnet := faultnet.New()
	s := startSite(t, partsOpts{Voters: 3, Net: fnet})
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	var others []*Node
	for _, n := range s.nodes {
		if n != ctl {
			others = append(others, n)
		}
	}
	// L leads; F is the first to take over (replica order), and neither
	// is the controller, so that cutting F from L leaves Raft alone.
	L, F, G := others[0], others[1], ctl

	var gate replicaGate
	s.reps = map[*Node]*Replicator{}
	for _, n := range s.nodes {
		st := s.stores[n]
		r := StartReplicator(ReplicatorConfig{Node: n, Server: s.servers[n], LagMax: time.Second,
			FetchMaxWait: 200 * time.Millisecond, Log: n.log,
			Stream: func(name string) *logstore.Stream {
				if n == L {
					gate.wait()
				}
				if name != "s" {
					return nil
				}
				return st.Stream(name)
			}})
		s.reps[n] = r
		t.Cleanup(r.Close)
	}
	t.Cleanup(gate.release) // before the Replicators close (cleanups run last first)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := G.Submit(ctx, rules.CreateStream{Name: "s", Replicas: []string{L.ID(), F.ID(), G.ID()}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.nodes {
		eventually(t, n.ID()+" knows L leads the stream", func() bool { return streamState(n).Leader == L.ID() })
	}
	eventually(t, "L serves the stream", func() bool { return s.servers[L].leader("s") != nil })
	appendRecs(t, s.stream(L), 20, "a")
	s.converged(s.nodes, 20)

	// F falls behind and out of the ISR.
	fnet.Partition(F.ID(), L.ID())
	appendRecs(t, s.stream(L), 20, "b")
	eventually(t, "L commits without F", func() bool {
		return s.stream(L).Committed() == 40 && !streamState(G).InISR(F.ID())
	})

	// L's Replicator stalls; F catches up and the controller takes it
	// back into the ISR, which L's state holds but its Leader does not.
	gate.hold()
	fnet.Heal(F.ID(), L.ID())
	eventually(t, "F back in the ISR, as L's state has it", func() bool {
		return streamState(G).InISR(F.ID()) && streamState(L).InISR(F.ID()) && s.stream(F).NextOffset() == 40
	})

	// F stops fetching; L takes more records while F is in the ISR.
	fnet.Partition(F.ID(), L.ID())
	appendRecs(t, s.stream(L), 20, "c")
	deadline := time.Now().Add(2 * time.Second) // 8 of maintainISR's ticks
	for time.Now().Before(deadline) {
		if c, end := s.stream(L).Committed(), s.stream(F).NextOffset(); c > end && streamState(G).InISR(F.ID()) {
			t.Errorf("L's watermark %d passed the log end %d of F, in the controller's ISR %v", c, end, streamState(G).ISR)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	acked := s.stream(L).Committed()

	// L dies: the controller elects F, the first alive ISR member. Every
	// record L acknowledged must be on it.
	gate.release()
	s.kill(L)
	eventually(t, "F leads", func() bool {
		return streamState(G).Leader == F.ID() && streamState(F).Leader == F.ID()
	})
	if end := s.stream(F).NextOffset(); end < acked {
		t.Fatalf("F leads holding %d records: L had acknowledged %d, %d of them are lost", end, acked, acked-end)
	}
}

// The same rule when the leader's copy of the state lags the controller's
// (Raft's appends to it are slow): maintainISR, from the older state,
// proposes the joiner again and is refused as stale, while the
// controller has it in the ISR already. The refusal must not stop the
// watermark waiting for it.
func TestReplicator_StaleISRProposalKeepsTheJoinerInTheWatermark(t *testing.T) {
	fnet := faultnet.New()
	s := startSite(t, partsOpts{Voters: 3, Net: fnet})
	ctl := s.controller(s.nodes)
	s.registered(s.nodes)
	var others []*Node
	for _, n := range s.nodes {
		if n != ctl {
			others = append(others, n)
		}
	}
	L, F, G := others[0], others[1], ctl
	s.replicate(time.Second, 0)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := G.Submit(ctx, rules.CreateStream{Name: "s", Replicas: []string{L.ID(), F.ID(), G.ID()}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.nodes {
		eventually(t, n.ID()+" knows L leads the stream", func() bool { return streamState(n).Leader == L.ID() })
	}
	eventually(t, "L serves the stream", func() bool { return s.servers[L].leader("s") != nil })
	appendRecs(t, s.stream(L), 20, "a")
	s.converged(s.nodes, 20)

	fnet.Partition(F.ID(), L.ID())
	appendRecs(t, s.stream(L), 20, "b")
	eventually(t, "L commits without F", func() bool {
		return s.stream(L).Committed() == 40 && !streamState(G).InISR(F.ID())
	})

	// The controller's Raft reaches L late (within L's lease: it keeps
	// committing); F catches up and the controller takes it back.
	fnet.Delay(G.ID(), L.ID()+"/raft", 900*time.Millisecond)
	fnet.Heal(F.ID(), L.ID())
	eventually(t, "F back in the controller's ISR", func() bool {
		return streamState(G).InISR(F.ID()) && s.stream(F).NextOffset() == 40
	})
	fnet.Partition(F.ID(), L.ID())
	appendRecs(t, s.stream(L), 20, "c")
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && streamState(G).InISR(F.ID()) {
		if c, end := s.stream(L).Committed(), s.stream(F).NextOffset(); c > end && streamState(G).InISR(F.ID()) {
			t.Fatalf("L's watermark %d passed the log end %d of F, in the controller's ISR %v", c, end, streamState(G).ISR)
		}
		time.Sleep(5 * time.Millisecond)
	}
	fnet.Delay(G.ID(), L.ID()+"/raft", 0)
	fnet.Heal(F.ID(), L.ID())
	s.converged(s.nodes, 60)
}
