package cluster

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/peatmq/peat/cluster/rules"
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
		ft.ok(rules.RegisterBroker{ID: b, Epoch: 1})
	}
	return ft
}

func (ft *fsmT) apply(c rules.Command) error {
	ft.tb.Helper()
	data, err := rules.EncodeCommand(c)
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

func (ft *fsmT) ok(c rules.Command) {
	ft.tb.Helper()
	if err := ft.apply(c); err != nil {
		ft.tb.Fatalf("Apply(%#v): %v", c, err)
	}
}

// want checks a stream's leader, ISR, leader epoch and version.
func (ft *fsmT) want(name, leader string, isr []string, epoch uint32, version uint64) {
	ft.tb.Helper()
	st, _ := ft.f.State()
	if s := st.Streams[name]; s == nil || s.Leader != leader || !slices.Equal(s.ISR, isr) || s.LeaderEpoch != epoch || s.Version != version {
		ft.tb.Fatalf("%s: %+v; want leader %q, ISR %v, epoch %d, version %d", name, s, leader, isr, epoch, version)
	}
}

func abc() []string { return []string{"a", "b", "c"} }

func TestFSM_BadEntries(t *testing.T) {
	ft := newFSMT(t, "a")
	for _, data := range [][]byte{nil, {0}, {99, 0x80}, {6, 0xc1}, {3, 0x92, 0xa1}} { // 6: AlterISR, 3: CreateStream
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
	ft.ok(rules.CreateStream{Name: "s", Replicas: abc(), UncleanElection: true})
	ft.ok(rules.CreateStream{Name: "t", Replicas: []string{"c"}})
	ft.ok(rules.BrokerFailed{ID: "a", Epoch: 1})
	ft.ok(rules.RegisterBroker{ID: "b", Epoch: 9})
	want, _ := ft.f.State()

	snap, err := ft.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	ft.ok(rules.CreateStream{Name: "later", Replicas: []string{"b"}}) // not in the snapshot
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
	gt.ok(rules.BrokerFailed{ID: "c", Epoch: 1}) // unclean election survived the snapshot: b takes over
	gt.want("s", "b", []string{"b"}, 4, 4)
	if err := g.Restore(io.NopCloser(bytes.NewReader([]byte{0xc1}))); err == nil {
		t.Fatal("Restore of garbage succeeded")
	}
}

func TestFSM_StateIsACopy(t *testing.T) {
	ft := newFSMT(t, "a", "b")
	ft.ok(rules.CreateStream{Name: "s", Replicas: []string{"a", "b"}})
	s, changed := ft.f.State()
	s.Streams["s"].ISR[0] = "z"
	s.Brokers["a"].Alive = false
	ft.want("s", "a", []string{"a", "b"}, 1, 1)
	select {
	case <-changed:
		t.Fatal("changed closed with no change")
	default:
	}
	ft.ok(rules.BrokerFailed{ID: "b", Epoch: 1})
	select {
	case <-changed:
	default:
		t.Fatal("changed not closed by a change")
	}
}

// Any entry, however malformed, is applied or refused, never a panic.
func FuzzFSM_Apply(f *testing.F) {
	for _, c := range []rules.Command{rules.RegisterBroker{ID: "a", Epoch: 1}, rules.RemoveBroker{ID: "b"}} {
		b, _ := rules.EncodeCommand(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ft := newFSMT(t, "a", "b", "c")
		ft.ok(rules.CreateStream{Name: "s", Replicas: abc()})
		ft.f.Apply(&raft.Log{Data: b})
	})
}

// View shares the state instead of copying it: that is safe only because
// a change replaces the state, so a View taken before stays as it was.
func TestFSM_ViewIsNotChangedByLaterCommands(t *testing.T) {
	ft := newFSMT(t, "n1", "n2")
	ft.ok(rules.CreateStream{Name: "s", Replicas: []string{"n1", "n2"}})
	v := ft.f.View()
	before, _ := ft.f.State()
	ft.ok(rules.RegisterBroker{ID: "n1", Epoch: 2}) // fences n1: a new leader, a smaller ISR
	ft.ok(rules.RegisterBroker{ID: "n3", Epoch: 1})
	if !reflect.DeepEqual(v, before) {
		t.Fatalf("a View changed under later commands:\n%+v\nwant\n%+v", v, before)
	}
	if now := ft.f.View(); reflect.DeepEqual(now, before) || now.Brokers["n3"] == nil {
		t.Fatalf("View after the commands = %+v, want the new state", now)
	}
}
