package cluster

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// leaderGate holds every node's Replicator before it starts a Leader for
// stream "s", once armed, until opened: the moment a node's state names
// it leader and no Leader runs there yet, widened at will.
type leaderGate struct {
	armed atomic.Bool
	open  chan struct{}
	once  sync.Once
}

func newLeaderGate() *leaderGate { return &leaderGate{open: make(chan struct{})} }

func (g *leaderGate) beforeLead(_, stream string) {
	if stream == "s" && g.armed.Load() {
		<-g.open
	}
}

func (g *leaderGate) release() { g.once.Do(func() { close(g.open) }) }

// appendAt is one append's outcome, sent when done is called.
type appendAt struct {
	first uint64
	err   error
}

func appendNoWait(s mqtt.Stream, payload string) <-chan appendAt {
	ch := make(chan appendAt, 1)
	s.AppendAsync([]*logstore.Record{{Topic: "s/x", QoS: 1, Payload: []byte(payload)}}, func(first uint64, err error) {
		ch <- appendAt{first, err}
	})
	return ch
}

// justNamed hands the leadership of "s" over from its leader while gate
// holds the other nodes' Leaders, and returns the node the state names
// next (no Leader runs there yet) and the third node, which knows it.
func justNamed(t *testing.T, gate *leaderGate) (next, other *testNode) {
	t.Helper()
	leader, others, _ := fwdSite(t, siteOpts{MinISR: 2, BeforeLead: gate.beforeLead})
	t.Cleanup(gate.release) // before the nodes stop: their Replicators wait on it
	gate.armed.Store(true)
	go leader.HandOver(handOverTimeout)
	eventually(t, "a follower named leader of s", func() bool {
		for i, n := range others {
			if id, _ := n.Log.Stream("s").(*stream).stateLeaderID(); id == n.Node.ID() {
				next, other = n, others[1-i]
				return true
			}
		}
		return false
	})
	if next.Log.Stream("s").(*stream).leading() != nil {
		t.Fatal("the new leader runs its Leader: the gate held nothing")
	}
	eventually(t, other.Node.ID()+" knows the new leader", func() bool {
		id, _, addr := other.Log.Stream("s").(*stream).stateLeader()
		return id == next.Node.ID() && addr != ""
	})
	return next, other
}

// TestLog_AppendWaitsForAJustNamedLeader: a producer that reaches the
// node the state has just named leader, before its Replicator started
// the Leader, and one whose node forwards there meanwhile, are answered
// once the Leader runs, in call order, not refused (which disconnects an
// MQTT 3.1.1 client) for a moment's delay.
func TestLog_AppendWaitsForAJustNamedLeader(t *testing.T) {
	gate := newLeaderGate()
	next, other := justNamed(t, gate)
	here1 := appendNoWait(next.Log.Route("s/x"), "here-1")
	there := appendNoWait(other.Log.Route("s/x"), "there")
	time.Sleep(300 * time.Millisecond) // the forward reaches the new leader
	here2 := appendNoWait(next.Log.Route("s/x"), "here-2")
	time.Sleep(200 * time.Millisecond)
	for name, ch := range map[string]<-chan appendAt{"here-1": here1, "there": there, "here-2": here2} {
		select {
		case r := <-ch:
			t.Fatalf("%s answered (first %d, err %v) before the new leader's Leader runs", name, r.first, r.err)
		default:
		}
	}
	gate.release()
	got := map[string]appendAt{}
	for name, ch := range map[string]<-chan appendAt{"here-1": here1, "there": there, "here-2": here2} {
		select {
		case got[name] = <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%s not answered", name)
		}
		if got[name].err != nil {
			t.Fatalf("%s refused: %v", name, got[name].err)
		}
	}
	if got["here-1"].first >= got["here-2"].first {
		t.Errorf("here-1 at %d, here-2 at %d: not in call order", got["here-1"].first, got["here-2"].first)
	}
	recs := committedRecs(t, next.Node.ID(), next.Log.Route("s/x"), got["here-2"].first+1)
	for name, r := range got {
		if p := string(recs[r.first].Payload); p != name {
			t.Errorf("offset %d holds %q, %s was acknowledged there", r.first, p, name)
		}
	}
}

// TestLog_AppendWaitsForAJustNamedLeaderOnlySoLong: a Leader that does not
// start within leaderStartWait (a node named before it registered this
// run) does not hold its producers: they are refused as while leadership
// moves.
func TestLog_AppendWaitsForAJustNamedLeaderOnlySoLong(t *testing.T) {
	gate := newLeaderGate()
	next, _ := justNamed(t, gate)
	ch := appendNoWait(next.Log.Route("s/x"), "held")
	select {
	case r := <-ch:
		if errors.Is(r.err, mqtt.ErrLeaderUnavailable) {
			t.Fatalf("refused at once: %v", r.err)
		}
		t.Fatalf("answered with no Leader running: first %d err %v", r.first, r.err)
	case <-time.After(leaderStartWait / 2):
	}
	select {
	case r := <-ch:
		if !errors.Is(r.err, mqtt.ErrLeaderUnavailable) {
			t.Fatalf("answered first %d err %v, want ErrLeaderUnavailable", r.first, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("held past leaderStartWait, with no Leader in sight")
	}
}

// TestLog_AppendWaitingForAJustNamedLeaderIsRefusedAtClose: a node that
// closes while an append waits for its Leader answers it (ErrClosed): the
// close neither hangs on it nor leaves its producer waiting.
func TestLog_AppendWaitingForAJustNamedLeaderIsRefusedAtClose(t *testing.T) {
	gate := newLeaderGate()
	next, _ := justNamed(t, gate)
	ch := appendNoWait(next.Log.Route("s/x"), "held")
	time.Sleep(100 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- next.Log.Close() }()
	select {
	case r := <-ch:
		if !errors.Is(r.err, logstore.ErrClosed) {
			t.Fatalf("answered first %d err %v, want ErrClosed", r.first, r.err)
		}
	case <-time.After(leaderStartWait - 500*time.Millisecond):
		t.Fatal("the held append was not answered when its node closed")
	}
	if err := <-closed; err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestLog_ForwardedAppendWaitsForTheStateHere: the controller's entry
// naming a new leader reaches a follower before the new leader itself
// (the controller's own node applies it first), and the follower
// forwards a producer's append in the new leader epoch at once. The new
// leader holds it until its own state names it and its Leader runs,
// rather than refusing it as "not the leader" (an MQTT 3.1.1 producer
// disconnected for a moment's delay); a forward in an epoch that does
// not come is refused after leaderStartWait. A state write and a claim
// forwarded in the new epoch wait the same way.
func TestLog_ForwardedAppendWaitsForTheStateHere(t *testing.T) {
	old, others, _ := fwdSite(t, siteOpts{MinISR: 2})
	ctl, next := others[0], others[1]
	epoch := streamState(next.Node).LeaderEpoch
	forward := func(n *testNode, epoch uint32, payload string) <-chan appendAt {
		ch := make(chan appendAt, 1)
		n.Log.Stream("s").(*stream).appendForwarded(epoch, []*logstore.Record{{Topic: "s/x", QoS: 1, Payload: []byte(payload)}},
			func(first uint64, err error) { ch <- appendAt{first, err} })
		return ch
	}
	early := forward(next, epoch+1, "early")
	// A state write and a claim forwarded in that epoch wait the same way.
	ns := next.Log.Stream("s").(*stream)
	wrote := make(chan wire.StateWriteResponse, 1)
	go func() {
		wrote <- ns.serveStateWrite(context.Background(), &wire.StateWriteRequest{Stream: "s", LeaderEpoch: epoch + 1,
			Puts: []wire.KV{{Key: "g", Val: []byte("1")}}, Node: ctl.Node.ID(), BrokerEpoch: ctl.Node.Epoch()})
	}()
	claimed := make(chan wire.ClaimResponse, 1)
	go func() {
		claimed <- ns.claims.serve(&wire.ClaimRequest{Stream: "s", LeaderEpoch: epoch + 1, Key: "k", Holder: "h",
			Node: ctl.Node.ID(), BrokerEpoch: ctl.Node.Epoch()})
	}()
	select {
	case r := <-early:
		t.Fatalf("answered (first %d, err %v) before the state here names epoch %d", r.first, r.err, epoch+1)
	case r := <-wrote:
		t.Fatalf("state write answered (%v: %s) before the state here names epoch %d", r.Code, r.Message, epoch+1)
	case r := <-claimed:
		t.Fatalf("claim answered (%v, granted %v) before the state here names epoch %d", r.Code, r.OK, epoch+1)
	case <-time.After(200 * time.Millisecond):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ctl.Node.Apply(ctx, rules.ElectLeader{Name: "s", Preferred: next.Node.ID()}); err != nil {
		t.Fatal(err)
	}
	var r appendAt
	select {
	case r = <-early:
	case <-time.After(time.Minute):
		t.Fatal("not answered")
	}
	if st := streamState(next.Node); st.Leader != next.Node.ID() || st.LeaderEpoch != epoch+1 {
		t.Fatalf("the state names %s in epoch %d; want %s in %d", st.Leader, st.LeaderEpoch, next.Node.ID(), epoch+1)
	}
	if r.err != nil {
		t.Fatalf("forwarded in the epoch the state here named next: %v; want it appended", r.err)
	}
	if recs := committedRecs(t, next.Node.ID(), next.Log.Stream("s"), r.first+1); string(recs[r.first].Payload) != "early" {
		t.Fatalf("offset %d holds %q", r.first, recs[r.first].Payload)
	}
	if r := <-wrote; r.Code != wire.None {
		t.Fatalf("state write forwarded in the epoch the state here named next: %v: %s; want it written", r.Code, r.Message)
	}
	if r := <-claimed; r.Code != wire.None || !r.OK {
		t.Fatalf("claim forwarded in the epoch the state here named next: %v, granted %v; want it granted", r.Code, r.OK)
	}

	// The old leader, a follower now, is sent an append in an epoch
	// that never comes.
	eventually(t, old.Node.ID()+" follows", func() bool { return old.Log.Stream("s").(*stream).leading() == nil })
	took := time.Now()
	never := forward(old, epoch+3, "never")
	select {
	case r := <-never:
		if !errors.Is(r.err, mqtt.ErrLeaderUnavailable) {
			t.Fatalf("forwarded in an epoch that never comes: first %d, err %v; want leader unavailable", r.first, r.err)
		}
		if d := time.Since(took); d < leaderStartWait/2 {
			t.Fatalf("refused after %v; want it held for leaderStartWait (%v)", d, leaderStartWait)
		}
	case <-time.After(time.Minute):
		t.Fatal("held past leaderStartWait")
	}
}
