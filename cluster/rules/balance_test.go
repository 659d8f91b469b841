package rules

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// A live broker is drained only when the streams it holds keep their
// replicas elsewhere; once draining it gets no new replica, and it
// survives its own restart.
func TestState_DrainBroker(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.refused(DrainBroker{ID: "c"}, ErrIneligibleReplica) // nowhere to move s's third replica
	ft.refused(DrainBroker{ID: "z"}, ErrUnknownBroker)
	ft.ok(RegisterBroker{ID: "d", Epoch: 1})
	ft.ok(DrainBroker{ID: "c"})
	ft.ok(DrainBroker{ID: "c"}) // again: nothing changes
	ft.refused(CreateStream{Name: "t", Replicas: []string{"c", "a"}}, ErrRemovedBroker)
	ft.ok(AssignReplicas{Name: "s", Replicas: []string{"a", "b", "c", "d"}}) // c may stay while it moves
	ft.ok(RegisterBroker{ID: "c", Epoch: 2})                                 // a restart keeps the drain
	st, _ := ft.f.State()
	if b := st.Brokers["c"]; !b.Draining || !b.Alive {
		t.Fatalf("c after its restart: %+v", b)
	}
	ft.refused(DrainBroker{ID: "d"}, ErrIneligibleReplica) // d holds nothing yet, but s's move needs it
}

func TestState_SetReplicationFactor(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"a", "b"}, ReplicationFactor: 2})
	v := ft.stream("s").Version
	ft.ok(SetReplicationFactor{Name: "s", ReplicationFactor: 3})
	if s := ft.stream("s"); s.Want() != 3 || s.Version != v {
		t.Fatalf("after the change: want %d version %d (was %d)", s.Want(), s.Version, v)
	}
	ft.refused(SetReplicationFactor{Name: "s", ReplicationFactor: 0}, ErrBadCommand)
	ft.refused(SetReplicationFactor{Name: "x", ReplicationFactor: 2}, ErrUnknownStream)
}

func TestPlanMoves_FactorAndDrain(t *testing.T) {
	r := func(ids ...string) []string { return ids }
	for _, tc := range []struct {
		name     string
		brokers  []string
		draining []string
		streams  map[string][2][]string
		rf       int
		want     map[string][]string
	}{
		{"a factor raised adds a replica at the end", r("a", "b", "c"), nil,
			map[string][2][]string{"s": {r("a", "b"), r("a", "b")}}, 3, map[string][]string{"s": r("a", "b", "c")}},
		{"a factor lowered drops the last replica", r("a", "b", "c"), nil,
			map[string][2][]string{"s": {r("a", "b", "c"), r("a", "b", "c")}}, 2, map[string][]string{"s": r("a", "b")}},
		{"never the leader", r("a", "b", "c"), nil,
			map[string][2][]string{"s": {r("a", "b", "c"), r("c", "a", "b")}}, 1, map[string][]string{"s": r("c")}},
		{"one outside the ISR before one in it", r("a", "b", "c"), nil,
			map[string][2][]string{"s": {r("a", "b", "c"), r("a", "c")}}, 2, map[string][]string{"s": r("a", "c")}},
		{"a dead one first", r("a", "-b", "c"), nil,
			map[string][2][]string{"s": {r("a", "b", "c"), r("a", "b", "c")}}, 2, map[string][]string{"s": r("a", "c")}},
		{"a draining broker's replacement comes first, in its place", r("a", "b", "c", "d"), r("a"),
			map[string][2][]string{"s": {r("a", "b", "c"), r("a", "b", "c")}}, 3, map[string][]string{"s": r("a", "d", "b", "c")}},
		{"it stays until the new one is in the ISR", r("a", "b", "c", "d"), r("a"),
			map[string][2][]string{"s": {r("a", "d", "b", "c"), r("a", "b", "c")}}, 3, nil},
		{"then goes, leadership with it", r("a", "b", "c", "d"), r("a"),
			map[string][2][]string{"s": {r("a", "d", "b", "c"), r("a", "b", "c", "d")}}, 3, map[string][]string{"s": r("d", "b", "c")}},
		{"a dead new replica holds a drain up", r("a", "b", "c", "-d"), r("a"),
			map[string][2][]string{"s": {r("a", "d", "b", "c"), r("a", "b", "c")}}, 3, nil},
		{"a draining broker with nowhere to go stays", r("a", "b", "c"), r("a"),
			map[string][2][]string{"s": {r("a", "b", "c"), r("a", "b", "c")}}, 3, nil},
		{"one removed after it died draining goes anyway", r("!a", "b", "c"), r("a"),
			map[string][2][]string{"s": {r("a", "b", "c"), r("b", "c")}}, 3, map[string][]string{"s": r("b", "c")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := planState(tc.brokers, tc.streams, tc.rf)
			for _, d := range tc.draining {
				st.Brokers[d].Draining = true
			}
			got := map[string][]string{}
			for _, m := range PlanMoves(st) {
				got[m.Name] = m.Replicas
			}
			if len(got) != len(tc.want) {
				t.Fatalf("moves %v, want %v", got, tc.want)
			}
			for name, want := range tc.want {
				if !slices.Equal(got[name], want) {
					t.Fatalf("%s moves to %v, want %v", name, got[name], want)
				}
			}
		})
	}
}

// A drain runs to its end through the state machine: the replacement is
// added, caught up, and the draining leader's replicas and leadership
// go in one step, the ISR never smaller than the factor.
func TestPlanMoves_DrainAccepted(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(DrainBroker{ID: "a"})
	st, _ := ft.f.State()
	moves := PlanMoves(st)
	if len(moves) != 1 {
		t.Fatalf("moves %v", moves)
	}
	ft.ok(moves[0])
	s := ft.stream("s")
	ft.ok(AlterISR{Name: "s", Leader: s.Leader, LeaderEpoch: s.LeaderEpoch, Version: s.Version,
		ISR: []ISRMember{{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}}})
	st, _ = ft.f.State()
	moves = PlanMoves(st)
	if len(moves) != 1 {
		t.Fatalf("moves %v", moves)
	}
	ft.ok(moves[0])
	if s := ft.stream("s"); !slices.Equal(s.Replicas, []string{"d", "b", "c"}) || len(s.ISR) != 3 || s.Leader != "d" {
		t.Fatalf("after the drain: %+v", s)
	}
	st, _ = ft.f.State()
	if m := PlanMoves(st); len(m) != 0 {
		t.Fatalf("moves after the drain: %v", m)
	}
	if b := st.Brokers["a"]; !b.Draining || len(st.ReplicaOf("a")) != 0 {
		t.Fatalf("a: %+v holding %v, want drained", b, st.ReplicaOf("a"))
	}
	ft.refused(RemoveBroker{ID: "a"}, ErrBrokerAlive) // stop it first
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	ft.ok(RemoveBroker{ID: "a"})
}

func TestQuorumWithout(t *testing.T) {
	up := func(ids ...string) func(string) bool { return func(id string) bool { return slices.Contains(ids, id) } }
	for _, tc := range []struct {
		name   string
		id     string
		voters []string
		alive  func(string) bool
		ok     bool
	}{
		{"a broker", "d", abc(), up("a", "b", "c", "d"), true},
		{"one of three, all up", "c", abc(), up("a", "b", "c"), true},
		{"one of three with another down", "c", abc(), up("a", "c"), false},
		{"the dead one of three", "c", abc(), up("a", "b"), true},
		{"the only voter", "a", []string{"a"}, up("a"), false},
		{"one of five with one down", "e", []string{"a", "b", "c", "d", "e"}, up("a", "b", "c", "e"), true},
		{"one of five with two down", "e", []string{"a", "b", "c", "d", "e"}, up("a", "b", "e"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := QuorumWithout(tc.id, tc.voters, tc.alive)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrQuorum)) {
				t.Fatalf("QuorumWithout(%s, %v) = %v, ok %v", tc.id, tc.voters, err, tc.ok)
			}
		})
	}
}

// The preferred replica leads again once it has been alive and in the
// ISR for after, one stream at a time; one that left the ISR starts the
// count again; a skipped stream (acks: leader) is never moved.
func TestPlanLeaders(t *testing.T) {
	st := planState([]string{"a", "b", "c"}, map[string][2][]string{
		"s": {{"a", "b", "c"}, {"b", "c", "a"}},
		"t": {{"a", "b", "c"}, {"b", "c", "a"}},
		"u": {{"a", "b", "c"}, {"b", "a"}},
		"v": {{"c", "a", "b"}, {"c", "a", "b"}},
		"w": {{"a", "b"}, {"b", "c", "a"}},
	}, 3)
	skip := func(name string) bool { return name == "w" }
	since := map[string]time.Time{}
	t0 := time.Unix(1000, 0)
	const after = time.Minute
	if e, next := PlanLeaders(st, since, t0, after, skip); e != nil || !next.Equal(t0.Add(after)) {
		t.Fatalf("at once: %+v, next %v", e, next)
	}
	e, _ := PlanLeaders(st, since, t0.Add(after), after, skip)
	if e == nil || e.Name != "s" || e.Preferred != "a" {
		t.Fatalf("after: %+v, want s to a", e)
	}
	st.Streams["s"].Leader = "a"
	st.Streams["t"].ISR = []string{"b", "c"} // a fell behind in t
	e, _ = PlanLeaders(st, since, t0.Add(after+time.Second), after, skip)
	if e == nil || e.Name != "u" {
		t.Fatalf("next: %+v, want u", e)
	}
	st.Streams["u"].Leader = "a"
	st.Streams["t"].ISR = []string{"b", "c", "a"}
	e, next := PlanLeaders(st, since, t0.Add(after+2*time.Second), after, skip)
	if e != nil || !next.Equal(t0.Add(2*after+2*time.Second)) {
		t.Fatalf("t back in sync: %+v next %v, want nothing until a minute later", e, next)
	}
	st.Brokers["a"].Draining = true
	if e, _ := PlanLeaders(st, since, t0.Add(time.Hour), after, skip); e != nil && e.Preferred == "a" {
		t.Fatalf("a draining broker is given %+v", e)
	}
}

// KeepBroker ends a drain; a removed broker stays removed.
func TestState_KeepBroker(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(DrainBroker{ID: "c"})
	ft.ok(KeepBroker{ID: "c"})
	st, _ := ft.f.State()
	if b := st.Brokers["c"]; b.Draining {
		t.Fatalf("c after KeepBroker: %+v", b)
	}
	if moves := PlanMoves(st); len(moves) != 0 {
		t.Fatalf("moves after KeepBroker: %+v, want none", moves)
	}
	ft.ok(KeepBroker{ID: "d"}) // not draining: nothing changes
	ft.refused(KeepBroker{ID: "z"}, ErrUnknownBroker)
	ft.ok(BrokerFailed{ID: "d", Epoch: 1})
	ft.ok(RemoveBroker{ID: "d"})
	ft.refused(KeepBroker{ID: "d"}, ErrRemovedBroker)
}

// A held stream (acks: leader) keeps its draining leader until that
// leader hands over (ElectLeader); then the same plan drops it. A stream
// not held moves leader and all in one step.
func TestPlanMoves_DrainHoldsAcksLeaderLeader(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	for _, name := range []string{"held", "free"} {
		ft.ok(CreateStream{Name: name, Replicas: []string{"a", "b", "c", "d"}, ReplicationFactor: 3})
	}
	ft.ok(DrainBroker{ID: "a"})
	hold := func(name string) bool { return name == "held" }
	st, _ := ft.f.State()
	moves := PlanMovesHolding(st, hold)
	if len(moves) != 1 || moves[0].Name != "free" {
		t.Fatalf("moves while held's leader a has not handed over: %v", moves)
	}
	ft.ok(moves[0])
	ft.ok(ElectLeader{Name: "held", Preferred: "b"}) // a hands over
	st, _ = ft.f.State()
	moves = PlanMovesHolding(st, hold)
	if len(moves) != 1 || moves[0].Name != "held" || slices.Contains(moves[0].Replicas, "a") {
		t.Fatalf("moves once a has handed over: %v", moves)
	}
}

// A leaving acks: leader leader is waited for up to the limit, counted
// from when its stream was first held, and the count goes on while its
// leader is still leaving; after that the stream moves at once.
func TestPlanMovesHeld(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "held", Replicas: []string{"a", "b", "c", "d"}, ReplicationFactor: 3})
	ft.ok(DrainBroker{ID: "a"})
	st, _ := ft.f.State()
	acksLeader := func(name string) bool { return name == "held" }
	t0, limit := time.Unix(1000, 0), 30*time.Second

	moves, held, next, overdue := PlanMovesHeld(st, acksLeader, nil, t0, limit)
	if len(moves) != 0 || !held["held"].Equal(t0) || !next.Equal(t0.Add(limit)) || overdue != nil {
		t.Fatalf("first pass: moves %v, held %v, next %v, overdue %v", moves, held, next, overdue)
	}
	// A pass that does not hold it (b fell out of the ISR) keeps the count.
	ft.ok(AlterISR{Name: "held", Leader: "a", LeaderEpoch: 1, Version: 1, ISR: []ISRMember{{"a", 1}, {"c", 1}, {"d", 1}}})
	st2, _ := ft.f.State()
	if _, held2, _, _ := PlanMovesHeld(st2, acksLeader, held, t0.Add(time.Second), limit); !held2["held"].Equal(t0) {
		t.Fatalf("count not kept: %v", held2)
	}
	moves, held, next, overdue = PlanMovesHeld(st, acksLeader, held, t0.Add(limit), limit)
	if len(moves) != 1 || slices.Contains(moves[0].Replicas, "a") || !slices.Equal(overdue, []string{"held"}) || !next.IsZero() {
		t.Fatalf("after the limit: moves %v, overdue %v, next %v", moves, overdue, next)
	}
	if moves, _, _, _ := PlanMovesHeld(st, nil, nil, t0, limit); len(moves) != 1 {
		t.Fatalf("acks=all: moves %v, want the move at once", moves)
	}
}
