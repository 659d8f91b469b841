package cluster

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

// fsmT applies commands through raft's entry path (encode, Apply, decode)
// and checks that a refused command changed nothing.
type fsmT struct {
	tb  testing.TB
	f   *FSM
	idx uint64
}

func newFSMT(tb testing.TB, brokers ...string) *fsmT {
	ft := &fsmT{tb: tb, f: NewFSM()}
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
	before, _ := ft.f.State()
	ft.idx++
	res := ft.f.Apply(&raft.Log{Index: ft.idx, Type: raft.LogCommand, Data: data})
	if res == nil {
		return nil
	}
	err, ok := res.(error)
	if !ok {
		ft.tb.Fatalf("Apply(%#v) returned %T, want error or nil", c, res)
	}
	if after, _ := ft.f.State(); !reflect.DeepEqual(before, after) {
		ft.tb.Fatalf("refused %#v (%v) but the state changed:\n%+v\n->\n%+v", c, err, before, after)
	}
	return err
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

func TestFSM_CreateStream(t *testing.T) {
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

func TestFSM_BrokerFailed(t *testing.T) {
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

func TestFSM_UncleanElection(t *testing.T) {
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

func TestFSM_RestartFencesTheOldIncarnation(t *testing.T) {
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

func TestFSM_AlterISR(t *testing.T) {
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

func TestFSM_ElectLeader(t *testing.T) {
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

func TestFSM_AssignReplicas(t *testing.T) {
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

func TestFSM_BadEntries(t *testing.T) {
	ft := newFSMT(t, "a")
	for _, data := range [][]byte{nil, {0}, {99, 0x80}, {kindAlterISR, 0xc1}, {kindCreateStream, 0x92, 0xa1}} {
		res := ft.f.Apply(&raft.Log{Index: 1, Data: data})
		if err, ok := res.(error); !ok || !errors.Is(err, ErrBadCommand) {
			t.Errorf("Apply(%x) = %v, want ErrBadCommand", data, res)
		}
	}
}

type sink struct {
	bytes.Buffer
	canceled bool
}

func (s *sink) ID() string    { return "test" }
func (s *sink) Cancel() error { s.canceled = true; return nil }
func (s *sink) Close() error  { return nil }

func TestFSM_SnapshotRestore(t *testing.T) {
	ft := newFSMT(t, "a", "b", "c")
	ft.ok(CreateStream{Name: "s", Replicas: abc(), UncleanElection: true})
	ft.ok(CreateStream{Name: "t", Replicas: []string{"c"}})
	ft.ok(BrokerFailed{ID: "a", Epoch: 1})
	ft.ok(RegisterBroker{ID: "b", Epoch: 9})
	want, _ := ft.f.State()

	snap, err := ft.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	ft.ok(CreateStream{Name: "later", Replicas: []string{"b"}}) // not in the snapshot
	var out sink
	if err := snap.Persist(&out); err != nil {
		t.Fatal(err)
	}
	snap.Release()

	g := NewFSM()
	_, changed := g.State()
	if err := g.Restore(io.NopCloser(&out)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Restore did not signal a change")
	}
	got, _ := g.State()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("restored\n%+v\nwant\n%+v", got, want)
	}
	// The restored machine goes on by the same rules.
	gt := &fsmT{tb: t, f: g}
	gt.want("s", "c", []string{"c"}, 3, 3)
	gt.ok(BrokerFailed{ID: "c", Epoch: 1}) // unclean election survived the snapshot: b takes over
	gt.want("s", "b", []string{"b"}, 4, 4)
	if err := g.Restore(io.NopCloser(bytes.NewReader([]byte{0xc1}))); err == nil {
		t.Fatal("Restore of garbage succeeded")
	}
}

func TestFSM_StateIsACopy(t *testing.T) {
	ft := newFSMT(t, "a", "b")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"a", "b"}})
	s, changed := ft.f.State()
	s.Streams["s"].ISR[0] = "z"
	s.Brokers["a"].Alive = false
	ft.want("s", "a", []string{"a", "b"}, 1, 1)
	select {
	case <-changed:
		t.Fatal("changed closed with no change")
	default:
	}
	ft.ok(BrokerFailed{ID: "b", Epoch: 1})
	select {
	case <-changed:
	default:
		t.Fatal("changed not closed by a change")
	}
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
		ft.f.Apply(&raft.Log{Data: b}) // never panics
	})
}

// View shares the state instead of copying it: that is safe only because
// a change replaces the state, so a View taken before stays as it was.
func TestFSM_ViewIsNotChangedByLaterCommands(t *testing.T) {
	ft := newFSMT(t, "n1", "n2")
	ft.ok(CreateStream{Name: "s", Replicas: []string{"n1", "n2"}})
	v := ft.f.View()
	before, _ := ft.f.State()
	ft.ok(RegisterBroker{ID: "n1", Epoch: 2}) // fences n1: a new leader, a smaller ISR
	ft.ok(RegisterBroker{ID: "n3", Epoch: 1})
	if !reflect.DeepEqual(v, before) {
		t.Fatalf("a View changed under later commands:\n%+v\nwant\n%+v", v, before)
	}
	if now := ft.f.View(); reflect.DeepEqual(now, before) || now.Brokers["n3"] == nil {
		t.Fatalf("View after the commands = %+v, want the new state", now)
	}
}
