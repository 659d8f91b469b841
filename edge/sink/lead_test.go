package sink

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// fakeLeadership names each stream's leader as the test sets it.
type fakeLeadership struct {
	mu      sync.Mutex
	leader  string
	epoch   uint64
	hold    bool
	changed chan struct{}
}

func (l *fakeLeadership) Hold() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold
}

func (l *fakeLeadership) setHold(h bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hold = h
	close(l.changed)
	l.changed = make(chan struct{})
}

func newFakeLeadership(leader string) *fakeLeadership {
	return &fakeLeadership{leader: leader, changed: make(chan struct{})}
}

func (l *fakeLeadership) Leader(string) (string, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leader, l.epoch, l.leader == "here"
}

func (l *fakeLeadership) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *fakeLeadership) set(leader string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leader = leader
	l.epoch++
	close(l.changed)
	l.changed = make(chan struct{})
}

// TestSink_SendsOnlyWhileItLeads: in a site a sink sends a stream only
// while its node leads it. A node that leads nothing holds no connection
// and shows the stream on standby with its leader; taking the stream up
// starts from the position as the site holds it then (another node moved
// it); losing it closes the connection and commits nothing more.
func TestSink_SendsOnlyWhileItLeads(t *testing.T) {
	log := mqtttest.NewMemLog(t, "default=#")
	st := log.Stream(t, "default")
	appendRecs(t, st, 20)
	up := &fakeUpstream{window: 4, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	ld := newFakeLeadership("n2")
	s, err := New(Config{Name: "s", Streams: []Stream{st}, Upstream: up, Positions: pos, Leadership: ld,
		BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(pos.commits) != 0 {
		t.Fatalf("a sink on a node that does not lead its stream committed %v", pos.commits)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	if got := s.Status(); got.State != StateStandby || got.Streams[0].Leader != "n2" || got.Streams[0].LagRecords != 0 {
		t.Fatalf("status while n2 leads: %+v, want standby, led by n2, no lag", got)
	}
	select {
	case <-up.conns:
		t.Fatal("the sink connected upstream while another node leads its only stream")
	case <-time.After(100 * time.Millisecond):
	}

	// n2 sent up to 3, then this node became the leader.
	if err := pos.Commit(Group("s"), "default", 3); err != nil {
		t.Fatal(err)
	}
	ld.set("here")
	c := <-up.conns
	got := c.take(t, 4)
	if got[0].Record.Offset != 3 {
		t.Fatalf("first delivery at offset %d, want 3: the position the site held when leadership came here", got[0].Record.Offset)
	}
	c.acks <- got[0].ID
	c.acks <- got[1].ID
	waitPos(t, pos, 5)

	// Leadership moves away: the connection ends, and the records in
	// flight are the new leader's to send.
	ld.set("n3")
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection stayed open after the node lost its only stream")
	}
	testwait.Eventually(t, "standby status", func() bool { return s.Status().State == StateStandby })
	if p := pos.get(); p != 5 {
		t.Fatalf("position %d after losing the stream, want 5 (nothing committed since)", p)
	}

	// n3 sent up to 12; leadership comes back here: the sink goes on from 12.
	if err := pos.Commit(Group("s"), "default", 12); err != nil {
		t.Fatal(err)
	}
	ld.set("here")
	c = <-up.conns
	if got := c.take(t, 1); got[0].Record.Offset != 12 {
		t.Fatalf("first delivery after leadership came back at %d, want 12", got[0].Record.Offset)
	}
}

// TestSink_HoldsWhileCutOff: a leader asked to hold (in a site, cut off
// from the controller) sends nothing new but keeps its connection and
// its window; acknowledgements still move the position, and once the
// hold ends it goes on where it was, sending nothing twice.
func TestSink_HoldsWhileCutOff(t *testing.T) {
	log := mqtttest.NewMemLog(t, "default=#")
	st := log.Stream(t, "default")
	appendRecs(t, st, 8)
	up := &fakeUpstream{window: 4, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	ld := newFakeLeadership("here")
	s, err := New(Config{Name: "s", Streams: []Stream{st}, Upstream: up, Positions: pos, Leadership: ld})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c := <-up.conns
	got := c.take(t, 4)
	ld.setHold(true)
	for _, d := range got {
		c.acks <- d.ID
	}
	waitPos(t, pos, 4)
	c.none(t) // the window is free, the records are there: held
	ld.setHold(false)
	if got := c.take(t, 4); got[0].Record.Offset != 4 {
		t.Fatalf("after the hold the sink sent offset %d first, want 4", got[0].Record.Offset)
	}
	select {
	case <-c.done:
		t.Fatal("the hold closed the connection")
	default:
	}
}
