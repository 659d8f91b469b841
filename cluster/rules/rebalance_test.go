package rules

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// A move is recorded only from a replica to a broker that may take it,
// for a stream not moving already; it ends once its source has left the
// replicas, and is dropped when either broker fails or leaves the site.
func TestState_MoveReplicas(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d", "e")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(CreateStream{Name: "t", Replicas: abc(), ReplicationFactor: 3})
	mv := func(stream, from, to string) MoveReplicas {
		return MoveReplicas{Moves: []StreamMove{{Stream: stream, From: from, To: to}}}
	}
	ft.refused(MoveReplicas{}, ErrBadCommand)
	ft.refused(mv("x", "a", "d"), ErrUnknownStream)
	ft.refused(mv("s", "d", "e"), ErrBadReplicas) // d is not a replica
	ft.refused(mv("s", "a", "b"), ErrBadReplicas) // b is one already
	ft.refused(mv("s", "a", "z"), ErrUnknownBroker)
	ft.refused(MoveReplicas{Moves: []StreamMove{{"s", "a", "d"}, {"s", "b", "d"}}}, ErrBadReplicas)
	// One bad move refuses the whole command: s does not move either.
	ft.refused(MoveReplicas{Moves: []StreamMove{{"s", "a", "d"}, {"t", "a", "z"}}}, ErrUnknownBroker)

	v := ft.stream("s").Version
	ft.ok(MoveReplicas{Moves: []StreamMove{{"s", "a", "d"}, {"s", "b", "e"}}})
	if s := ft.stream("s"); !slices.Equal(s.Moves, []ReplicaMove{{"a", "d"}, {"b", "e"}}) || s.Version != v ||
		!slices.Equal(s.Replicas, abc()) {
		t.Fatalf("s after MoveReplicas: %+v", s)
	}
	ft.refused(mv("s", "c", "d"), ErrBadReplicas) // moving already

	// The target fails: its move is dropped, the other goes on.
	ft.ok(BrokerFailed{ID: "e", Epoch: 1})
	if s := ft.stream("s"); !slices.Equal(s.Moves, []ReplicaMove{{"a", "d"}}) {
		t.Fatalf("s after e failed: moves %v, want a -> d only", s.Moves)
	}
	ft.refused(mv("t", "a", "e"), ErrIneligibleReplica) // e is dead
	// Done once the source has left the replicas.
	ft.ok(AssignReplicas{Name: "s", Replicas: []string{"a", "d", "b", "c"}})
	if s := ft.stream("s"); len(s.Moves) != 1 {
		t.Fatalf("s with d added: moves %v, want a -> d still", s.Moves)
	}
	ft.ok(AssignReplicas{Name: "s", Replicas: []string{"d", "b", "c"}})
	if s := ft.stream("s"); s.Moves != nil {
		t.Fatalf("s after the move: moves %v, want none", s.Moves)
	}

	// The source fails, or the target is drained: dropped.
	ft.ok(mv("t", "a", "d"))
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	if s := ft.stream("t"); s.Moves != nil {
		t.Fatalf("t after a failed: moves %v, want none", s.Moves)
	}
	ft.ok(mv("t", "b", "d"))
	ft.ok(RegisterBroker{ID: "f", Epoch: 1}) // somewhere for d's replica of s to go
	ft.ok(DrainBroker{ID: "d"})
	if s := ft.stream("t"); s.Moves != nil {
		t.Fatalf("t after d was drained: moves %v, want none", s.Moves)
	}
	ft.refused(mv("t", "b", "d"), ErrIneligibleReplica) // draining
	ft.refused(mv("t", "a", "e"), ErrIneligibleReplica) // both dead
}

// roundTrip is a machine whose state went through a snapshot of f's.
func roundTrip(t *testing.T, f *machine) *machine {
	t.Helper()
	b, err := EncodeState(f.st)
	if err != nil {
		t.Fatal(err)
	}
	st, err := DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	return &machine{st: st}
}

// A snapshot keeps the moves under way; a state without moves encodes
// as an older Peat wrote it (no Moves key), and such a state restores as
// one without any.
func TestState_MovesInSnapshots(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(CreateStream{Name: "t", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(MoveReplicas{Moves: []StreamMove{{"s", "a", "d"}}})
	want, _ := ft.f.State()
	if got, _ := roundTrip(t, ft.f).State(); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored\n%+v\nwant\n%+v", got, want)
	}

	old := want.Clone()
	old.Streams["s"].Moves = nil
	b, err := msgpack.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("Moves")) {
		t.Fatal("a state without moves names Moves")
	}
	got, err := DecodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, old) || len(PlanMoves(got)) != 0 {
		t.Fatalf("a state without moves restored as %+v", got.Streams["s"])
	}
}

// PlanMoves makes a recorded move add first and remove after: the target
// joins in the source's place, and the source leaves only once every
// kept replica is in the ISR, its leadership with it.
func TestPlanMoves_Moving(t *testing.T) {
	r := func(ids ...string) []string { return ids }
	for _, tc := range []struct {
		name    string
		brokers []string
		stream  [2][]string
		moves   []ReplicaMove
		want    []string // nil: no move
	}{
		{"the target is added in the source's place", r("a", "b", "c", "d", "e"), [2][]string{r("a", "b", "c"), r("a", "b", "c")},
			[]ReplicaMove{{"b", "e"}}, r("a", "b", "e", "c")},
		{"the source stays until the target is in the ISR", r("a", "b", "c", "d", "e"),
			[2][]string{r("a", "b", "e", "c"), r("a", "b", "c")}, []ReplicaMove{{"b", "e"}}, nil},
		{"then goes", r("a", "b", "c", "d", "e"),
			[2][]string{r("a", "b", "e", "c"), r("a", "b", "e", "c")}, []ReplicaMove{{"b", "e"}}, r("a", "e", "c")},
		{"not while another kept replica is out of the ISR", r("a", "b", "c", "d", "e"),
			[2][]string{r("a", "b", "e", "c"), r("a", "b", "e")}, []ReplicaMove{{"b", "e"}}, nil},
		{"a leader goes with its leadership", r("a", "b", "c", "d"),
			[2][]string{r("a", "d", "b", "c"), r("a", "b", "c", "d")}, []ReplicaMove{{"a", "d"}}, r("d", "b", "c")},
		{"two moves of one stream", r("a", "b", "c", "d", "e"), [2][]string{r("a", "b", "c"), r("a", "b", "c")},
			[]ReplicaMove{{"c", "d"}, {"a", "e"}}, r("a", "e", "b", "c", "d")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := planState(tc.brokers, map[string][2][]string{"s": tc.stream}, 3)
			st.Streams["s"].Moves = tc.moves
			moves := PlanMoves(st)
			switch {
			case tc.want == nil && len(moves) != 0:
				t.Fatalf("moves %v, want none", moves)
			case tc.want != nil && (len(moves) != 1 || !slices.Equal(moves[0].Replicas, tc.want)):
				t.Fatalf("moves %v, want s on %v", moves, tc.want)
			}
		})
	}
}

// loadOf counts each broker's replicas in st.
func loadOf(st *State) map[string]int {
	load := map[string]int{}
	for _, x := range st.Streams {
		for _, r := range x.Replicas {
			load[r]++
		}
	}
	return load
}

// rebalanceState is a site of brokers (planState's marks) with n streams
// of factor rf on the first rf brokers, every replica in the ISR.
func rebalanceState(brokers []string, n, rf int) *State {
	streams := map[string][2][]string{}
	for i := range n {
		rs := slices.Clone(brokers[:rf])
		// Leaders spread over the first brokers, as PickReplicas spreads them.
		k := i % rf
		rs = append(rs[k:], rs[:k]...)
		streams[fmt.Sprintf("s%02d", i)] = [2][]string{rs, slices.Clone(rs)}
	}
	return planState(brokers, streams, rf)
}

func TestPlanRebalance(t *testing.T) {
	t.Run("3 to 5 brokers, factor 3: counts within one", func(t *testing.T) {
		for _, n := range []int{1, 2, 5, 10, 17} {
			st := rebalanceState([]string{"a", "b", "c", "d", "e"}, n, 3)
			moves, load := PlanRebalance(st)
			if !Balanced(load) || len(load) != 5 {
				t.Fatalf("%d streams: counts after %v: %v", n, moves, load)
			}
			// The counts are what the moves make of the state.
			want := map[string]int{"d": 0, "e": 0}
			maps.Copy(want, loadOf(st))
			for _, m := range moves {
				want[m.From]--
				want[m.To]++
			}
			if !maps.Equal(load, want) {
				t.Fatalf("%d streams: counts %v, the moves make %v", n, load, want)
			}
			if n == 10 && len(moves) != 12 { // 30 replicas: 6 on each, 4 moves off each of a, b and c
				t.Fatalf("10 streams: %d moves %v, want 12", len(moves), moves)
			}
			// Deterministic.
			again, _ := PlanRebalance(rebalanceState([]string{"a", "b", "c", "d", "e"}, n, 3))
			if !slices.Equal(moves, again) {
				t.Fatalf("planned %v, then %v", moves, again)
			}
		}
	})
	t.Run("factor 1", func(t *testing.T) {
		st := rebalanceState([]string{"a", "b", "c"}, 6, 1)
		moves, load := PlanRebalance(st)
		if len(moves) != 4 || !maps.Equal(load, map[string]int{"a": 2, "b": 2, "c": 2}) {
			t.Fatalf("moves %v, counts %v", moves, load)
		}
	})
	t.Run("followers move before leaders", func(t *testing.T) {
		st := rebalanceState([]string{"a", "b", "c", "d"}, 3, 3)
		moves, _ := PlanRebalance(st)
		for _, m := range moves {
			if st.Streams[m.Stream].Leader == m.From {
				t.Fatalf("moves %v: %s leads %s", moves, m.From, m.Stream)
			}
		}
	})
	t.Run("dead, draining and removed brokers are never chosen", func(t *testing.T) {
		st := rebalanceState([]string{"a", "b", "c", "-d", "e", "f", "!g"}, 6, 3)
		st.Brokers["f"].Draining = true
		moves, load := PlanRebalance(st)
		if _, ok := load["d"]; ok || load["f"] != 0 || load["g"] != 0 || len(load) != 4 {
			t.Fatalf("counts %v, want a, b, c and e only", load)
		}
		for _, m := range moves {
			if m.To != "e" {
				t.Fatalf("moves %v, want to e only", moves)
			}
		}
		if !Balanced(load) {
			t.Fatalf("counts %v", load)
		}
	})
	t.Run("a stream with a dead, leaving or lagging replica does not move", func(t *testing.T) {
		st := rebalanceState([]string{"a", "b", "c", "d"}, 2, 3)
		st.Streams["s00"].ISR = []string{"a", "b"}
		st.Streams["s01"].ISR = []string{"b", "c"}
		if moves, _ := PlanRebalance(st); len(moves) != 0 {
			t.Fatalf("moves %v of a stream out of sync", moves)
		}
		st = rebalanceState([]string{"a", "b", "c", "d", "e"}, 2, 3)
		st.Brokers["c"].Draining = true
		if moves, _ := PlanRebalance(st); len(moves) != 0 {
			t.Fatalf("moves %v of streams a drain is moving", moves)
		}
	})
	t.Run("a stream already moving is not planned again, and counts as moved", func(t *testing.T) {
		st := rebalanceState([]string{"a", "b", "c", "d"}, 4, 3)
		st.Streams["s01"].Moves = []ReplicaMove{{"a", "d"}}
		moves, load := PlanRebalance(st)
		for _, m := range moves {
			if m.Stream == "s01" {
				t.Fatalf("moves %v: s01 planned again", moves)
			}
		}
		if len(moves) != 2 || !Balanced(load) || load["d"] != 3 {
			t.Fatalf("moves %v, counts %v: want two more onto d", moves, load)
		}
	})
	t.Run("nothing to do on a balanced site", func(t *testing.T) {
		st := rebalanceState([]string{"a", "b", "c"}, 4, 3)
		if moves, load := PlanRebalance(st); len(moves) != 0 || !Balanced(load) {
			t.Fatalf("moves %v, counts %v", moves, load)
		}
		st = rebalanceState([]string{"a", "b", "c", "d"}, 1, 3) // 1, 1, 1, 0: within one
		if moves, load := PlanRebalance(st); len(moves) != 0 || !Balanced(load) {
			t.Fatalf("moves %v, counts %v", moves, load)
		}
	})
}

// A rebalance runs to its end through the state machine, the replicas
// catching up as the leader reports them: every stream keeps a full ISR
// of at least its factor at every step, and ends on counts within one,
// no move left.
func TestRebalance_Accepted(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	for i := range 10 {
		ft.ok(CreateStream{Name: fmt.Sprintf("s%02d", i), Replicas: PickReplicas(fmt.Sprintf("s%02d", i), abc(), 3),
			ReplicationFactor: 3})
	}
	ft.ok(RegisterBroker{ID: "d", Epoch: 1})
	ft.ok(RegisterBroker{ID: "e", Epoch: 1})
	st, _ := ft.f.State()
	moves, want := PlanRebalance(st)
	if len(moves) == 0 {
		t.Fatal("nothing planned")
	}
	ft.ok(MoveReplicas{Moves: moves})
	for step := 0; ; step++ {
		if step > 100 {
			t.Fatal("no end")
		}
		st, _ = ft.f.State()
		for _, x := range st.Streams {
			if len(x.ISR) < 3 {
				t.Fatalf("step %d: %s has ISR %v", step, x.Name, x.ISR)
			}
		}
		todo := PlanMoves(st)
		if len(todo) == 0 {
			break
		}
		for _, c := range todo {
			ft.ok(c)
			// The new replicas catch up: the leader takes them in.
			x := ft.stream(c.Name)
			var isr []ISRMember
			for _, r := range x.Replicas {
				isr = append(isr, ISRMember{ID: r, Epoch: 1})
			}
			ft.ok(AlterISR{Name: x.Name, Leader: x.Leader, LeaderEpoch: x.LeaderEpoch, Version: x.Version, ISR: isr})
		}
	}
	st, _ = ft.f.State()
	if got := loadOf(st); !maps.Equal(got, want) || !Balanced(got) {
		t.Fatalf("counts %v, planned %v", got, want)
	}
	for _, x := range st.Streams {
		if x.Moves != nil || len(x.Replicas) != 3 || len(x.ISR) != 3 || !slices.Contains(x.Replicas, x.Leader) {
			t.Fatalf("%s after the rebalance: %+v", x.Name, x)
		}
	}
	if m, _ := PlanRebalance(st); len(m) != 0 {
		t.Fatalf("planned again: %v", m)
	}
}
