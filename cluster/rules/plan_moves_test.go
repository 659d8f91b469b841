package rules

import (
	"errors"
	"slices"
	"testing"
)

// A broker gone for good is removed only while dead and not the last
// in-sync replica of a stream; it is never added to a stream again, and
// registers only once no stream names it, as a new broker.
func TestState_RemoveBroker(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(CreateStream{Name: "solo", Replicas: []string{"c"}})

	ft.refused(RemoveBroker{ID: "a"}, ErrBrokerAlive)
	ft.refused(RemoveBroker{ID: "z"}, ErrUnknownBroker)
	ft.ok(BrokerFailed{ID: "c", Epoch: 1})
	ft.refused(RemoveBroker{ID: "c"}, ErrIneligibleReplica) // solo's only in-sync replica

	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	ft.ok(RemoveBroker{ID: "a"})
	ft.ok(RemoveBroker{ID: "a"}) // again: nothing changes
	ft.refused(CreateStream{Name: "t", Replicas: []string{"a", "b"}}, ErrRemovedBroker)
	ft.refused(AssignReplicas{Name: "solo", Replicas: []string{"c", "a"}}, ErrRemovedBroker)
	ft.refused(RegisterBroker{ID: "a", Epoch: 2}, ErrRemovedBroker) // its replica of s is still there

	ft.ok(AssignReplicas{Name: "s", Replicas: []string{"a", "d", "b", "c"}}) // a may stay while it moves
	ft.ok(AssignReplicas{Name: "s", Replicas: []string{"d", "b", "c"}})
	ft.refused(RegisterBroker{ID: "a", Epoch: 0}, ErrStaleBrokerEpoch)
	ft.ok(RegisterBroker{ID: "a", Epoch: 2}) // back, holding nothing: a new broker
	st, _ := ft.f.State()
	if b := st.Brokers["a"]; b.Removed || !b.Alive || b.Epoch != 2 {
		t.Fatalf("a after its return: %+v", b)
	}
	if got := ft.stream("s").Want(); got != 3 {
		t.Fatalf("replication factor %d, want 3", got)
	}
}

// planState is a state for PlanMoves: brokers by id ("-x": failed,
// "!x": removed), streams as name -> replicas, ISR.
func planState(brokers []string, streams map[string][2][]string, rf int) *State {
	st := NewState()
	for _, b := range brokers {
		id, alive, removed := b, true, false
		switch b[0] {
		case '-':
			id, alive = b[1:], false
		case '!':
			id, alive, removed = b[1:], false, true
		}
		st.Brokers[id] = &Broker{ID: id, Epoch: 1, Alive: alive, Removed: removed}
	}
	for name, ri := range streams {
		st.Streams[name] = &Stream{Name: name, Replicas: ri[0], ISR: ri[1], Leader: ri[1][0], ReplicationFactor: rf}
	}
	return st
}

func TestPlanMoves(t *testing.T) {
	r := func(ids ...string) []string { return ids }
	for _, tc := range []struct {
		name    string
		brokers []string
		streams map[string][2][]string
		rf      int
		want    map[string][]string // stream -> new replicas; absent: no move
	}{
		{"nothing to do", r("a", "b", "c", "d"), map[string][2][]string{"s": {r("a", "b", "c"), r("a", "b", "c")}}, 3, nil},
		{"a failed broker is not moved on a guess", r("-a", "b", "c", "d"),
			map[string][2][]string{"s": {r("a", "b", "c"), r("b", "c")}}, 3, nil},
		{"a removed broker's replacement comes first, in its place", r("!a", "b", "c", "d"),
			map[string][2][]string{"s": {r("a", "b", "c"), r("b", "c")}}, 3,
			map[string][]string{"s": r("a", "d", "b", "c")}},
		{"the removed one goes once the new one is in the ISR", r("!a", "b", "c", "d"),
			map[string][2][]string{"s": {r("a", "d", "b", "c"), r("b", "c", "d")}}, 3,
			map[string][]string{"s": r("d", "b", "c")}},
		{"not before", r("!a", "b", "c", "d"),
			map[string][2][]string{"s": {r("a", "d", "b", "c"), r("b", "c")}}, 3, nil},
		{"a new replica that died does not hold the move up", r("!a", "b", "c", "-d"),
			map[string][2][]string{"s": {r("a", "d", "b", "c"), r("b", "c")}}, 3,
			map[string][]string{"s": r("d", "b", "c")}},
		{"no broker to move to: the removed one goes anyway", r("!a", "b", "c"),
			map[string][2][]string{"s": {r("a", "b", "c"), r("b", "c")}}, 3,
			map[string][]string{"s": r("b", "c")}},
		{"a stream short of its factor grows on a new broker", r("a", "b", "c"),
			map[string][2][]string{"s": {r("a", "b"), r("a", "b")}}, 3,
			map[string][]string{"s": r("a", "b", "c")}},
		{"the least loaded broker is taken", r("!a", "b", "c", "d", "e"),
			map[string][2][]string{"s": {r("a", "b"), r("b")}, "t": {r("d", "c"), r("d", "c")}}, 2,
			map[string][]string{"s": r("a", "e", "b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moves := PlanMoves(planState(tc.brokers, tc.streams, tc.rf))
			got := map[string][]string{}
			for _, m := range moves {
				got[m.Name] = m.Replicas
			}
			if len(got) != len(tc.want) {
				t.Fatalf("moves %v, want %v", got, tc.want)
			}
			for name, want := range tc.want {
				if !slices.Equal(got[name], want) {
					t.Fatalf("%s moves to %v, want %v (all: %v)", name, got[name], want, got)
				}
			}
		})
	}
}

// Two streams short of a replica share the two new brokers out, one
// each (which gets which follows the names' hashes).
func TestPlanMoves_SpreadsOverNewBrokers(t *testing.T) {
	st := planState([]string{"a", "b", "c", "d"}, map[string][2][]string{
		"s": {{"a", "b"}, {"a", "b"}}, "t": {{"a", "b"}, {"a", "b"}}}, 3)
	moves := PlanMoves(st)
	if len(moves) != 2 || len(moves[0].Replicas) != 3 || len(moves[1].Replicas) != 3 ||
		moves[0].Replicas[2] == moves[1].Replicas[2] {
		t.Fatalf("moves %v, want c for one stream and d for the other", moves)
	}
}

// Every move PlanMoves makes is one the state machine takes.
func TestPlanMoves_Accepted(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), ReplicationFactor: 3})
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	ft.ok(RemoveBroker{ID: "a"})
	st, _ := ft.f.State()
	moves := PlanMoves(st)
	if len(moves) != 1 || !slices.Equal(moves[0].Replicas, []string{"a", "d", "b", "c"}) {
		t.Fatalf("moves %v", moves)
	}
	ft.ok(moves[0])
	st, _ = ft.f.State()
	if m := PlanMoves(st); len(m) != 0 {
		t.Fatalf("moves before d is in the ISR: %v", m)
	}
	s := ft.stream("s")
	ft.ok(AlterISR{Name: "s", Leader: s.Leader, LeaderEpoch: s.LeaderEpoch, Version: s.Version,
		ISR: []ISRMember{{"b", 1}, {"c", 1}, {"d", 1}}})
	st, _ = ft.f.State()
	moves = PlanMoves(st)
	if len(moves) != 1 {
		t.Fatalf("moves %v", moves)
	}
	ft.ok(moves[0])
	if got := ft.stream("s"); !slices.Equal(got.Replicas, []string{"d", "b", "c"}) || len(got.ISR) != 3 {
		t.Fatalf("stream after the move: %+v", got)
	}
	st, _ = ft.f.State()
	if m := PlanMoves(st); len(m) != 0 {
		t.Fatalf("moves after the move: %v", m)
	}
	if err := ft.apply(RegisterBroker{ID: "a", Epoch: 5}); err != nil || errors.Is(err, ErrRemovedBroker) {
		t.Fatalf("a registers after its move: %v", err)
	}
}
