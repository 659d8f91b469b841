package rules

import (
	"errors"
	"reflect"
	"slices"
	"testing"
)

// machine applies commands as the controller's state machine does (Next:
// on a copy, kept only on success), without Raft.
type machine struct{ st *State }

// State is a copy of the current state (the FSM's signature, so that the
// tests read as they do against it).
func (m *machine) State() (*State, <-chan struct{}) { return m.st.Clone(), nil }

// fsmT applies commands through the entry path (encode, decode, Next)
// and checks that a refused command changed nothing.
type fsmT struct {
	tb testing.TB
	f  *machine
}

func newFSMT(tb testing.TB, brokers ...string) *fsmT {
	ft := &fsmT{tb: tb, f: &machine{st: NewState()}}
	for _, b := range brokers {
		ft.ok(RegisterBroker{ID: b, Epoch: 1})
	}
	return ft
}

func (ft *fsmT) apply(c Command) error {
	ft.tb.Helper()
	data, err := EncodeCommand(c)
	if err != nil {
		ft.tb.Fatal(err)
	}
	d, err := DecodeCommand(data)
	if err != nil {
		return err
	}
	before := ft.f.st.Clone()
	next, err := Next(ft.f.st, d)
	if err != nil {
		if !reflect.DeepEqual(before, ft.f.st) {
			ft.tb.Fatalf("refused %#v (%v) but the state changed:\n%+v\n->\n%+v", c, err, before, ft.f.st)
		}
		return err
	}
	ft.f.st = next
	return nil
}

func (ft *fsmT) ok(c Command) {
	ft.tb.Helper()
	if err := ft.apply(c); err != nil {
		ft.tb.Fatalf("Apply(%#v): %v", c, err)
	}
}

func (ft *fsmT) refused(c Command, want error) {
	ft.tb.Helper()
	if err := ft.apply(c); !errors.Is(err, want) {
		ft.tb.Fatalf("Apply(%#v) = %v, want %v", c, err, want)
	}
}

func (ft *fsmT) stream(name string) *Stream {
	ft.tb.Helper()
	s, _ := ft.f.State()
	st := s.Streams[name]
	if st == nil {
		ft.tb.Fatalf("no stream %q", name)
	}
	return st
}

// want checks a stream's leader, ISR, leader epoch and version.
func (ft *fsmT) want(name, leader string, isr []string, epoch uint32, version uint64) {
	ft.tb.Helper()
	st := ft.stream(name)
	if st.Leader != leader || !slices.Equal(st.ISR, isr) || st.LeaderEpoch != epoch || st.Version != version {
		ft.tb.Fatalf("%s: leader %q ISR %v epoch %d version %d; want %q %v %d %d",
			name, st.Leader, st.ISR, st.LeaderEpoch, st.Version, leader, isr, epoch, version)
	}
}

func abc() []string { return []string{"a", "b", "c"} }

func TestState_CreateStream(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "telemetry", Replicas: abc()})
	ft.want("telemetry", "a", abc(), 1, 1)

	t.Run("again with the same replicas changes nothing", func(t *testing.T) {
		ft.ok(CreateStream{Name: "telemetry", Replicas: abc()})
		ft.want("telemetry", "a", abc(), 1, 1)
	})
	t.Run("again with other replicas is refused", func(t *testing.T) {
		ft.refused(CreateStream{Name: "telemetry", Replicas: []string{"b", "c"}}, ErrStreamExists)
	})
	t.Run("unknown, repeated or no replicas are refused", func(t *testing.T) {
		ft.refused(CreateStream{Name: "x", Replicas: []string{"a", "z"}}, ErrUnknownBroker)
		ft.refused(CreateStream{Name: "x", Replicas: []string{"a", "a"}}, ErrBadReplicas)
		ft.refused(CreateStream{Name: "x"}, ErrBadReplicas)
		ft.refused(CreateStream{Replicas: abc()}, ErrBadCommand)
	})
	t.Run("only alive replicas start in the ISR, the first leads", func(t *testing.T) {
		ft.ok(BrokerFailed{ID: "a", Epoch: 1})
		ft.ok(CreateStream{Name: "meters", Replicas: abc()})
		ft.want("meters", "b", []string{"b", "c"}, 1, 1)
	})
	t.Run("with no replica alive it is refused", func(t *testing.T) {
		ft.ok(BrokerFailed{ID: "b", Epoch: 1})
		ft.ok(BrokerFailed{ID: "c", Epoch: 1})
		ft.refused(CreateStream{Name: "x", Replicas: abc()}, ErrIneligibleReplica)
	})
}

func TestState_BrokerFailed(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "s", Replicas: abc()})
	ft.ok(CreateStream{Name: "t", Replicas: []string{"c", "b"}})

	t.Run("a failed leader leaves the ISR and the next ISR member leads", func(t *testing.T) {
		ft.ok(BrokerFailed{ID: "a", Epoch: 1})
		ft.want("s", "b", []string{"b", "c"}, 2, 2)
		ft.want("t", "c", []string{"c", "b"}, 1, 1) // a was not a replica
	})
	t.Run("a failed follower leaves the ISR; the leader stays", func(t *testing.T) {
		ft.ok(BrokerFailed{ID: "c", Epoch: 1})
		ft.want("s", "b", []string{"b"}, 2, 3)
		ft.want("t", "b", []string{"b"}, 2, 2)
	})
	t.Run("a stale epoch's failure changes nothing", func(t *testing.T) {
		ft.ok(RegisterBroker{ID: "c", Epoch: 2})
		ft.refused(BrokerFailed{ID: "c", Epoch: 1}, ErrStaleBrokerEpoch)
		ft.refused(BrokerFailed{ID: "z", Epoch: 1}, ErrUnknownBroker)
	})
	t.Run("the last ISR member stays, and the stream goes offline", func(t *testing.T) {
		ft.ok(BrokerFailed{ID: "b", Epoch: 1})
		ft.want("s", "", []string{"b"}, 3, 4)
		ft.want("t", "", []string{"b"}, 3, 3)
	})
	t.Run("no leader outside the ISR: c is alive but not in sync", func(t *testing.T) {
		ft.refused(ElectLeader{Name: "s", Preferred: "c"}, ErrIneligibleReplica)
		ft.ok(ElectLeader{Name: "s"})
		ft.want("s", "", []string{"b"}, 3, 4)
	})
	t.Run("the last member's return brings the stream back under it", func(t *testing.T) {
		ft.ok(RegisterBroker{ID: "b", Epoch: 2})
		ft.want("s", "b", []string{"b"}, 4, 5)
		ft.want("t", "b", []string{"b"}, 4, 4)
	})
}

func TestState_UncleanElection(t *testing.T) {
	ft := newFSMT(t, "a", "b")
	ft.ok(CreateStream{Name: "clean", Replicas: []string{"a", "b"}})
	ft.ok(CreateStream{Name: "unclean", Replicas: []string{"a", "b"}, UncleanElection: true})
	ft.ok(BrokerFailed{ID: "b", Epoch: 1})
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	ft.want("clean", "", []string{"a"}, 2, 3)
	ft.want("unclean", "", []string{"a"}, 2, 3)
	ft.ok(RegisterBroker{ID: "b", Epoch: 2})
	ft.want("clean", "", []string{"a"}, 2, 3)    // b is behind: the stream waits for a
	ft.want("unclean", "b", []string{"b"}, 3, 4) // the stream enabled it: b's log wins
}

func TestState_RestartFencesTheOldIncarnation(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "s", Replicas: abc()})
	ft.refused(RegisterBroker{ID: "a", Epoch: 0}, ErrStaleBrokerEpoch)
	ft.ok(RegisterBroker{ID: "a", Epoch: 1}) // the same incarnation again: nothing to fence
	ft.want("s", "a", abc(), 1, 1)
	ft.ok(RegisterBroker{ID: "a", Epoch: 7}) // restarted without Serf noticing it fail
	ft.want("s", "b", []string{"b", "c"}, 2, 2)
	// An ISR change naming a's old epoch is refused; its new one is accepted.
	ft.refused(AlterISR{Name: "s", Leader: "b", LeaderEpoch: 2, Version: 2,
		ISR: []ISRMember{{"a", 1}, {"b", 1}, {"c", 1}}}, ErrStaleBrokerEpoch)
	ft.ok(AlterISR{Name: "s", Leader: "b", LeaderEpoch: 2, Version: 2,
		ISR: []ISRMember{{"c", 1}, {"a", 7}, {"b", 1}}})
	ft.want("s", "b", abc(), 2, 3) // kept in replica order
}

func TestState_AlterISR(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: abc()})
	shrink := AlterISR{Name: "s", Leader: "a", LeaderEpoch: 1, Version: 1, ISR: []ISRMember{{"a", 1}, {"b", 1}}}

	for _, tc := range []struct {
		name string
		edit func(c *AlterISR)
		want error
	}{
		{"stale version", func(c *AlterISR) { c.Version = 0 }, ErrStaleVersion},
		{"stale leader epoch (a deposed leader)", func(c *AlterISR) { c.LeaderEpoch = 0 }, ErrStaleLeaderEpoch},
		{"not the leader", func(c *AlterISR) { c.Leader = "b" }, ErrStaleLeaderEpoch},
		{"no leader named", func(c *AlterISR) { c.Leader = "" }, ErrStaleLeaderEpoch},
		{"the leader left out", func(c *AlterISR) { c.ISR = []ISRMember{{"b", 1}} }, ErrIneligibleReplica},
		{"not a replica", func(c *AlterISR) { c.ISR = append(c.ISR, ISRMember{"d", 1}) }, ErrIneligibleReplica},
		{"named twice", func(c *AlterISR) { c.ISR = append(c.ISR, ISRMember{"b", 1}) }, ErrIneligibleReplica},
		{"another broker epoch", func(c *AlterISR) { c.ISR[1].Epoch = 2 }, ErrStaleBrokerEpoch},
		{"unknown stream", func(c *AlterISR) { c.Name = "x" }, ErrUnknownStream},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			c := shrink
			c.ISR = slices.Clone(shrink.ISR)
			tc.edit(&c)
			ft.refused(c, tc.want)
		})
	}
	t.Run("the current version is accepted once", func(t *testing.T) {
		ft.ok(shrink)
		ft.want("s", "a", []string{"a", "b"}, 1, 2)
		ft.refused(shrink, ErrStaleVersion)
	})
	t.Run("a failed broker cannot rejoin", func(t *testing.T) {
		ft.ok(BrokerFailed{ID: "c", Epoch: 1})
		ft.refused(AlterISR{Name: "s", Leader: "a", LeaderEpoch: 1, Version: 2,
			ISR: []ISRMember{{"a", 1}, {"b", 1}, {"c", 1}}}, ErrIneligibleReplica)
	})
	t.Run("after a leader change the old leader's request is refused", func(t *testing.T) {
		ft.ok(ElectLeader{Name: "s", Preferred: "b"})
		ft.want("s", "b", []string{"a", "b"}, 2, 3)
		ft.refused(AlterISR{Name: "s", Leader: "a", LeaderEpoch: 1, Version: 3, ISR: []ISRMember{{"a", 1}}}, ErrStaleLeaderEpoch)
		ft.ok(AlterISR{Name: "s", Leader: "b", LeaderEpoch: 2, Version: 3, ISR: []ISRMember{{"b", 1}}})
		ft.want("s", "b", []string{"b"}, 2, 4)
	})
}

func TestState_ElectLeader(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "s", Replicas: abc()})
	ft.ok(ElectLeader{Name: "s"}) // the leader is eligible: kept
	ft.want("s", "a", abc(), 1, 1)
	ft.ok(ElectLeader{Name: "s", Preferred: "c"})
	ft.want("s", "c", abc(), 2, 2)
	ft.ok(ElectLeader{Name: "s", Preferred: "c"}) // already: nothing moves
	ft.want("s", "c", abc(), 2, 2)
	ft.refused(ElectLeader{Name: "x"}, ErrUnknownStream)
}

func TestState_AssignReplicas(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c", "d")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"a", "b"}})
	ft.ok(AssignReplicas{Name: "s", Replicas: []string{"b", "c", "d"}})
	ft.want("s", "b", []string{"b"}, 2, 3) // a led and left; c and d catch up before they join
	if got := ft.stream("s").Replicas; !slices.Equal(got, []string{"b", "c", "d"}) {
		t.Fatalf("replicas %v", got)
	}
	ft.refused(AssignReplicas{Name: "s", Replicas: []string{"c", "d"}}, ErrIneligibleReplica)
	ft.refused(AssignReplicas{Name: "s", Replicas: []string{"b", "z"}}, ErrUnknownBroker)
	ft.refused(AssignReplicas{Name: "x", Replicas: []string{"b"}}, ErrUnknownStream)
}

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range []Command{RegisterBroker{"a", 1}, CreateStream{"s", abc(), true, 3},
		AlterISR{"s", "a", 1, 2, []ISRMember{{"a", 1}}}, RemoveBroker{"b"}} {
		b, _ := EncodeCommand(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ft := newFSMT(t, "a", "b", "c")
		ft.ok(CreateStream{Name: "s", Replicas: abc()})
		if c, err := DecodeCommand(b); err == nil {
			_ = ft.apply(c) // a refusal must change nothing: apply checks
		}
	})
}

func TestDecodeCommand_BadEntries(t *testing.T) {
	for _, data := range [][]byte{nil, {0}, {99, 0x80}, {kindAlterISR, 0xc1}, {kindCreateStream, 0x92, 0xa1}} {
		if _, err := DecodeCommand(data); !errors.Is(err, ErrBadCommand) {
			t.Errorf("DecodeCommand(%x) = %v, want ErrBadCommand", data, err)
		}
	}
}
