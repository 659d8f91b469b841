package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// fakeUpstream hands out fakeConns the test steers: it sees every
// delivery and decides which to acknowledge, in any order.
type fakeUpstream struct {
	window int
	conns  chan *fakeConn
}

func (u *fakeUpstream) String() string { return "fake" }

func (u *fakeUpstream) Connect(ctx context.Context) (Conn, error) {
	c := &fakeConn{window: u.window, acks: make(chan uint64, 1024), sent: make(chan Delivery, 1024), done: make(chan struct{})}
	select {
	case u.conns <- c:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type fakeConn struct {
	window int
	acks   chan uint64
	sent   chan Delivery
	once   sync.Once
	done   chan struct{}
}

func (c *fakeConn) Window() int                 { return c.window }
func (c *fakeConn) Flush(context.Context) error { return nil }
func (c *fakeConn) Acks() <-chan uint64         { return c.acks }
func (c *fakeConn) Err() error                  { return errors.New("fake connection ended") }
func (c *fakeConn) Close() error                { c.end(); return nil }
func (c *fakeConn) end()                        { c.once.Do(func() { close(c.done); close(c.acks) }) }
func (c *fakeConn) Send(_ context.Context, d Delivery) error {
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	c.sent <- d
	return nil
}

// take reads n deliveries, failing the test if they do not come.
func (c *fakeConn) take(t *testing.T, n int) []Delivery {
	t.Helper()
	var out []Delivery
	for len(out) < n {
		select {
		case d := <-c.sent:
			out = append(out, d)
		case <-time.After(30 * time.Second):
			t.Fatalf("got %d deliveries, want %d", len(out), n)
		}
	}
	return out
}

// none checks that nothing more is sent for a moment.
func (c *fakeConn) none(t *testing.T) {
	t.Helper()
	select {
	case d := <-c.sent:
		t.Fatalf("offset %d sent beyond the window", d.Record.Offset)
	case <-time.After(100 * time.Millisecond):
	}
}

type mapPositions struct {
	mu      sync.Mutex
	m       map[string]uint64
	commits []uint64
}

func (p *mapPositions) Load(group, stream string) (uint64, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	off, ok := p.m[group+"/"+stream]
	return off, ok, nil
}

func (p *mapPositions) Commit(group, stream string, off uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[group+"/"+stream] = off
	p.commits = append(p.commits, off)
	return nil
}

// count is how many commits there were.
func (p *mapPositions) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.commits)
}

func (p *mapPositions) get() uint64 {
	off, _, _ := p.Load(Group("s"), "default")
	return off
}

func waitPos(t *testing.T, p *mapPositions, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for p.get() != want {
		if time.Now().After(deadline) {
			t.Fatalf("position %d, want %d", p.get(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runSink(t *testing.T, st Stream, up Upstream, pos Positions) *Sink {
	t.Helper()
	s, err := New(Config{Name: "s", Streams: []Stream{st}, Upstream: up, Positions: pos,
		BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func appendRecs(t *testing.T, st *mqtttest.MemStream, n int) {
	t.Helper()
	recs := make([]*logstore.Record, n)
	for i := range recs {
		recs[i] = &logstore.Record{Topic: "t", QoS: 1}
	}
	errc := make(chan error, 1)
	st.AppendAsync(recs, func(_ uint64, err error) { errc <- err })
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// The position is the end of the contiguous acknowledged prefix. The
// window bounds what is unacknowledged (as an MQTT 5 Receive Maximum
// does), so acknowledgements above a hole free it, but the position
// waits for the hole; a connection's end commits what it acknowledged,
// and the next one starts there.
func TestSink_PositionIsTheContiguousAcknowledgedPrefix(t *testing.T) {
	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	appendRecs(t, st, 10)
	up := &fakeUpstream{window: 4, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	runSink(t, st, up, pos)
	c := <-up.conns

	ds := c.take(t, 4) // offsets 0..3: the window
	c.none(t)
	c.acks <- ds[3].ID // out of order: 3, 1, 2 acknowledged, 0 not yet
	c.acks <- ds[1].ID
	c.acks <- ds[2].ID
	more := c.take(t, 3) // three acknowledged: three more may go
	if more[0].Record.Offset != 4 || more[2].Record.Offset != 6 {
		t.Fatalf("sent %d..%d, want 4..6", more[0].Record.Offset, more[2].Record.Offset)
	}
	c.none(t) // 0, 4, 5 and 6 unacknowledged: the window is full
	if got := pos.get(); got != 0 {
		t.Fatalf("position %d with offset 0 unacknowledged, want 0", got)
	}
	c.acks <- ds[0].ID
	waitPos(t, pos, 4) // within commitInterval, short of a commit batch
	c.acks <- more[0].ID
	c.take(t, 1) // offset 7

	// The connection drops with 5..7 in flight: its end commits 5, and
	// the next one starts there and sends them again.
	c.end()
	c = <-up.conns
	waitPos(t, pos, 5)
	ds = c.take(t, 4)
	if ds[0].Record.Offset != 5 || ds[3].Record.Offset != 8 {
		t.Fatalf("after a reconnect sent %d..%d, want 5..8", ds[0].Record.Offset, ds[3].Record.Offset)
	}
	for _, d := range ds {
		c.acks <- d.ID
	}
	for _, d := range c.take(t, 1) {
		c.acks <- d.ID
	}
	waitPos(t, pos, 10)
	for i := 1; i < len(pos.commits); i++ {
		if pos.commits[i] <= pos.commits[i-1] {
			t.Fatalf("commits %v go backwards", pos.commits)
		}
	}
}

// While a backlog drains, the position is committed once a commit batch
// is acknowledged, not every quarter window: each commit is a state
// write, fsynced under fsync durability. What a crash would send again,
// the records sent and not under the position, stays within the window
// plus one batch, even behind a record that is never acknowledged.
func TestSink_CommitsInBatchesAndBoundsWhatACrashResends(t *testing.T) {
	const window = 8
	batch := commitBatchOf(window)
	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	appendRecs(t, st, 4*batch)
	up := &fakeUpstream{window: window, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	runSink(t, st, up, pos)
	c := <-up.conns

	// Acknowledge everything but offset 0: the pump goes on until the
	// window plus a batch is sent and not under the position.
	first := c.take(t, 1)[0]
	sent := 1
	for more := true; more; {
		select {
		case d := <-c.sent:
			c.acks <- d.ID
			sent++
		case <-time.After(300 * time.Millisecond):
			more = false
		}
	}
	if sent > window+batch || sent < window+batch-batchOf(window) {
		t.Fatalf("%d records sent behind an unacknowledged one, want the window plus a commit batch (%d)", sent, window+batch)
	}
	if got := pos.get(); got != 0 {
		t.Fatalf("position %d with offset 0 unacknowledged, want 0", got)
	}

	// Acknowledging 0 commits at once: a batch is waiting.
	c.acks <- first.ID
	waitPos(t, pos, uint64(sent))
	commits, start := pos.count(), time.Now()
	for end := sent + 2*batch; sent < end; sent++ {
		c.acks <- c.take(t, 1)[0].ID
	}
	for pos.get() < uint64(sent-batch) {
		time.Sleep(5 * time.Millisecond)
	}
	// Two batches, and one more for each commitInterval the test took
	// (a slow machine's pump may find fewer than a batch waiting).
	if n, most := pos.count()-commits, 2+int(time.Since(start)/commitInterval); n > most {
		t.Fatalf("%d commits for %d acknowledged records, want at most %d (batches of %d)", n, 2*batch, most, batch)
	}
}

func TestSink_StalledWithoutAcknowledgements(t *testing.T) {
	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	up := &fakeUpstream{window: 4, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	s, err := New(Config{Name: "s", Streams: []Stream{st}, Upstream: up, Positions: pos, StallAfter: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c := <-up.conns
	// Connected and nothing to send: connected, however long it stays so.
	time.Sleep(400 * time.Millisecond)
	if got := s.Status().State; got != StateConnected {
		t.Fatalf("idle sink is %s, want connected", got)
	}
	appendRecs(t, st, 2)
	ds := c.take(t, 2) // sent, never acknowledged: the socket is fine, progress is not
	deadline := time.Now().Add(30 * time.Second)
	for s.Status().State != StateStalled {
		if time.Now().After(deadline) {
			t.Fatalf("state %s, want stalled", s.Status().State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.acks <- ds[0].ID
	c.acks <- ds[1].ID
	waitPos(t, pos, 2)
	if got := s.Status().State; got != StateConnected {
		t.Fatalf("state %s after progress, want connected", got)
	}
}

func TestBucket_PacesToTheRate(t *testing.T) {
	now := time.Unix(0, 0)
	b := newBucket(100, now) // burst 10
	if n, _ := b.take(64, now); n != 10 {
		t.Fatalf("first take %d, want the burst 10", n)
	}
	n, wait := b.take(64, now)
	if n != 0 || wait != 10*time.Millisecond {
		t.Fatalf("empty bucket: %d, wait %v; want 0 and 10ms", n, wait)
	}
	total := 0
	for i := 0; i < 100; i++ { // one second in 10 ms steps
		now = now.Add(10 * time.Millisecond)
		n, _ := b.take(64, now)
		total += n
	}
	if total != 100 {
		t.Fatalf("%d records in a second at 100/s", total)
	}
}

// TestSink_DrainsABacklogInBatches: acknowledgements that come one at a
// time during a drain are committed (and the window refilled) a quarter
// window at a time, not one by one: each commit is a state write, and
// the read after it an iterator over the log.
func TestSink_DrainsABacklogInBatches(t *testing.T) {
	const n, window = 1000, 64
	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	appendRecs(t, st, n)
	up := &fakeUpstream{window: window, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	runSink(t, st, up, pos)
	c := <-up.conns

	next := uint64(0)
	var pending []Delivery
	for next < n {
		for more := true; more; { // everything sent so far, before the acknowledgement
			select {
			case d := <-c.sent:
				pending = append(pending, d)
			default:
				more = false
			}
		}
		if len(pending) == 0 {
			pending = c.take(t, 1)
		}
		d := pending[0]
		pending = pending[1:]
		if d.Record.Offset != next {
			t.Fatalf("got offset %d, want %d", d.Record.Offset, next)
		}
		next++
		c.acks <- d.ID
		// Give the pump time to act on this one acknowledgement alone.
		select {
		case d := <-c.sent:
			pending = append(pending, d)
		case <-time.After(2 * time.Millisecond):
		}
	}
	waitPos(t, pos, n)
	pos.mu.Lock()
	commits := append([]uint64(nil), pos.commits...)
	pos.mu.Unlock()
	// The start, one commit per batch of 16, and some slack for exact
	// ones (the pump found everything it had sent acknowledged).
	if max := 1 + n/batchOf(window) + 8; len(commits) > max {
		t.Fatalf("%d commits for %d records one acknowledgement at a time, want at most %d: %v", len(commits), n, max, commits)
	}
}

// TestSink_FollowsAddedAndRemovedStreams: a stream added while the sink
// runs is sent from Start; removing a stream with records in flight
// frees the window for the others, and late acknowledgements of those
// records are ignored.
func TestSink_FollowsAddedAndRemovedStreams(t *testing.T) {
	log := mqtttest.NewMemLog(t, "a=a/#", "b=b/#")
	a, b := log.Stream(t, "a"), log.Stream(t, "b")
	appendRecs(t, a, 10)
	appendRecs(t, b, 3)
	up := &fakeUpstream{window: 4, conns: make(chan *fakeConn)}
	pos := &mapPositions{m: map[string]uint64{}}
	s, err := New(Config{Name: "s", Streams: []Stream{a}, Upstream: up, Positions: pos})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c := <-up.conns

	inA := c.take(t, 4) // a's first four fill the window, none acknowledged
	if err := s.AddStream(b); err != nil {
		t.Fatal(err)
	}
	c.none(t) // b waits: the window is full
	s.RemoveStream("a")
	got := c.take(t, 3)
	for i, d := range got {
		if d.Stream != "b" || d.Record.Offset != uint64(i) {
			t.Fatalf("delivery %d: %s offset %d, want b offset %d", i, d.Stream, d.Record.Offset, i)
		}
	}
	c.acks <- inA[0].ID // late: ignored, a is gone
	for _, d := range got {
		c.acks <- d.ID
	}
	testwait.Eventually(t, "b's position at 3", func() bool {
		off, _, _ := pos.Load(Group("s"), "b")
		return off == 3
	})
	if off, _, _ := pos.Load(Group("s"), "a"); off != 0 {
		t.Errorf("a's position %d after its stream was removed with nothing acknowledged, want 0", off)
	}
	if st := s.Status(); len(st.Streams) != 1 || st.Streams[0].Stream != "b" {
		t.Errorf("status streams %+v, want only b", st.Streams)
	}
}

// resumeUpstream hands out fakeConns that are Resumers: the upstream
// holds each stream as in holds.
type resumeUpstream struct {
	fakeUpstream
	holds map[string]Held
}

type resumeConn struct {
	*fakeConn
	holds map[string]Held
}

func (c resumeConn) Resume(_ context.Context, stream string) (Held, bool, error) {
	h, ok := c.holds[stream]
	return h, ok, nil
}

func (u *resumeUpstream) Connect(ctx context.Context) (Conn, error) {
	c, err := u.fakeUpstream.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return resumeConn{c.(*fakeConn), u.holds}, nil
}

// TestSink_AddedStreamResumesFromTheUpstream: a stream added while the
// sink is connected to an upstream that is its own checkpoint (Kafka
// exactly-once) starts after what the upstream already holds of it, as
// the streams a connection starts with do, not from the sink's older
// position there.
func TestSink_AddedStreamResumesFromTheUpstream(t *testing.T) {
	log := mqtttest.NewMemLog(t, "a=a/#", "b=b/#")
	a, b := log.Stream(t, "a"), log.Stream(t, "b")
	appendRecs(t, a, 2)
	appendRecs(t, b, 10)
	up := &resumeUpstream{fakeUpstream{window: 4, conns: make(chan *fakeConn)}, map[string]Held{"b": {Next: 6}}}
	pos := &mapPositions{m: map[string]uint64{}}
	s, err := New(Config{Name: "s", Streams: []Stream{a}, Upstream: up, Positions: pos})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c := <-up.conns
	for _, d := range c.take(t, 2) {
		c.acks <- d.ID
	}
	testwait.Eventually(t, "a's position at 2", func() bool {
		off, _, _ := pos.Load(Group("s"), "a")
		return off == 2
	})

	if err := s.AddStream(b); err != nil {
		t.Fatal(err)
	}
	got := c.take(t, 4)
	for i, d := range got {
		if d.Stream != "b" || d.Record.Offset != uint64(6+i) {
			t.Fatalf("delivery %d after adding b: %s offset %d, want b offset %d (after what the upstream holds)",
				i, d.Stream, d.Record.Offset, 6+i)
		}
	}
	if off, _, _ := pos.Load(Group("s"), "b"); off != 6 {
		t.Errorf("b's position %d, want 6: moved past what the upstream holds", off)
	}
}

// TestSink_LeadershipArrivingResumesFromTheUpstream: in a site, a stream
// whose leadership comes to this node after the sink connected starts
// after what the upstream (Kafka exactly-once) holds of it, not from the
// position the site replicated, which may be older.
func TestSink_LeadershipArrivingResumesFromTheUpstream(t *testing.T) {
	log := mqtttest.NewMemLog(t, "a=a/#", "default=#")
	a, def := log.Stream(t, "a"), log.Stream(t, "default")
	appendRecs(t, a, 2)
	appendRecs(t, def, 10)
	up := &resumeUpstream{fakeUpstream{window: 4, conns: make(chan *fakeConn)}, map[string]Held{"default": {Next: 7}}}
	pos := &mapPositions{m: map[string]uint64{}}
	// a is led here from the start; default by n2 until the test moves it.
	ld := &streamLeadership{fakeLeadership: newFakeLeadership("n2"), here: map[string]bool{"a": true}}
	s, err := New(Config{Name: "s", Streams: []Stream{a, def}, Upstream: up, Positions: pos, Leadership: ld})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c := <-up.conns
	for _, d := range c.take(t, 2) {
		if d.Stream != "a" {
			t.Fatalf("sent %s while n2 leads it", d.Stream)
		}
		c.acks <- d.ID
	}
	if err := pos.Commit(Group("s"), "default", 3); err != nil { // n2 sent up to 3
		t.Fatal(err)
	}
	ld.set("here")
	if got := c.take(t, 1); got[0].Stream != "default" || got[0].Record.Offset != 7 {
		t.Fatalf("first delivery after leadership came: %s offset %d, want default offset 7", got[0].Stream, got[0].Record.Offset)
	}
}

// streamLeadership is fakeLeadership with streams led here whatever it
// names.
type streamLeadership struct {
	*fakeLeadership
	here map[string]bool
}

func (l *streamLeadership) Leader(stream string) (string, uint64, bool) {
	leader, epoch, here := l.fakeLeadership.Leader(stream)
	if l.here[stream] {
		return "here", 0, true
	}
	return leader, epoch, here
}

// TestSink_ResumeChecksTheUpstreamHoldsThisStream: an upstream that is
// its own checkpoint moves the position only when its last record is the
// stream's record at that offset. A stream deleted and created again
// starts its offsets anew under the same name: the upstream's last record
// of the old one must not make the sink skip the new one's records.
func TestSink_ResumeChecksTheUpstreamHoldsThisStream(t *testing.T) {
	defer func(d time.Duration) { resumeWait = d }(resumeWait)
	resumeWait = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		held Held
		from uint64 // the first offset sent
	}{
		{"this stream's record", Held{Next: 3, Time: 1002, Topic: "t/2"}, 3},
		{"beyond the stream's end", Held{Next: 9, Time: 1008, Topic: "t/8"}, 0},
		{"another time at that offset", Held{Next: 3, Time: 555, Topic: "t/2"}, 0},
		{"another topic at that offset", Held{Next: 3, Time: 1002, Topic: "x"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
			recs := make([]*logstore.Record, 5)
			for i := range recs {
				recs[i] = &logstore.Record{Topic: fmt.Sprintf("t/%d", i), QoS: 1, Timestamp: int64(1000 + i)}
			}
			errc := make(chan error, 1)
			st.AppendAsync(recs, func(_ uint64, err error) { errc <- err })
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			up := &resumeUpstream{fakeUpstream{window: 8, conns: make(chan *fakeConn)}, map[string]Held{"default": tc.held}}
			pos := &mapPositions{m: map[string]uint64{}}
			s, err := New(Config{Name: "s", Streams: []Stream{st}, Upstream: up, Positions: pos})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); s.Run(ctx) }()
			defer func() { cancel(); <-done }()
			c := <-up.conns
			got := c.take(t, int(5-tc.from))
			if got[0].Record.Offset != tc.from {
				t.Fatalf("first record sent: offset %d, want %d", got[0].Record.Offset, tc.from)
			}
		})
	}
}
