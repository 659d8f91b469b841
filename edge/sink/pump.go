package sink

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// cursor is a sink's place in one stream. The pump owns next and slots;
// position and progressAt are read by the monitor and Status too.
type cursor struct {
	stream Stream
	name   string
	m      streamMetrics

	// position is durable: every record below it was acknowledged
	// upstream or skipped by the filter.
	position atomic.Uint64
	// progressAt (unix ns) is when position last moved, or when the
	// monitor last saw nothing to send: the stall clock.
	progressAt atomic.Int64
	// lastSuccess (unix ns) is the last acknowledgement; 0 for none.
	lastSuccess atomic.Int64

	next  uint64 // next offset to send (or skip)
	slots []slot // sent and not yet under position, in offset order
	// ahead holds records read from the log and not sent yet, from next
	// on (readAhead): one read of a stored batch serves several sends.
	// Whatever moves next other than a send drops it (moveTo).
	ahead []*logstore.Record
	// resendBelow: records below it were sent on an earlier connection
	// (counted as retried when sent again).
	resendBelow uint64
	closed      bool // the stream was removed or closed

	// led: this node sends the stream, in leader epoch ledEpoch (lead.go;
	// always on a single node). Owned by the pump, like next.
	led      bool
	ledEpoch uint64
	// watched is the position a Watcher showed at the last look: a change
	// of it that is not the sink's own commit is a seek.
	watched   uint64
	watchedOK bool
}

// moveTo continues c from off, dropping what it had read ahead.
func (c *cursor) moveTo(off uint64) {
	c.next = off
	clear(c.ahead)
	c.ahead = c.ahead[:0]
}

// readAhead is how many records a read from the log asks for, beyond
// what the window has room for (ReadBytes bounds it too). The log stores
// records in batches (a group commit each) and a read parses every batch
// it touches whole: reading a quarter window at a time parsed the same
// batch again and again, a tenth of a drain's CPU.
const readAhead = 256

// slot is one record in flight.
type slot struct {
	id     uint64
	off    uint64
	sentAt time.Time
	acked  bool
}

// prefix is the end of the contiguous acknowledged prefix: the first
// unacknowledged slot, or next when all are acknowledged.
func (c *cursor) prefix() uint64 {
	for _, sl := range c.slots {
		if !sl.acked {
			return sl.off
		}
	}
	return c.next
}

// ack marks the slot of off acknowledged; false when there is none.
func (c *cursor) ack(off uint64) bool {
	i := sort.Search(len(c.slots), func(i int) bool { return c.slots[i].off >= off })
	if i == len(c.slots) || c.slots[i].off != off || c.slots[i].acked {
		return false
	}
	c.slots[i].acked = true
	return true
}

// ref says where a delivery id points.
type ref struct {
	c   *cursor
	off uint64
}

// pumpState is what one connection's pump keeps.
type pumpState struct {
	conn     Conn
	window   int
	inflight map[uint64]ref // the Sink's, kept across connections
	rate     *bucket
	rr       int // the cursor the next fill starts with (round robin)
	// cursors is the sink's list as this pump last took it (list).
	cursors []*cursor
	list    *[]*cursor
	// batch is how many records the pump gathers before it reads: a
	// quarter of the window (see batchOf). commitEvery is how many
	// acknowledged records it gathers before it commits (see
	// commitBatchOf); committedAt is when it last did.
	batch       int
	commitEvery int
	committedAt time.Time
}

// batchOf is the pump's batch for a window. Each commit (a state write)
// and each read from the log (an iterator over a stored batch) has a
// fixed cost; taken one acknowledgement at a time they cost more than the
// record itself. So while a backlog drains, the pump commits and reads
// once a quarter of the window is free, and the upstream still has three
// quarters in flight meanwhile.
func batchOf(window int) int { return max(1, window/4) }

// commitBatchOf is how many acknowledged records the pump gathers before
// it makes them durable: a quarter of the window, and at least
// minCommitBatch. A commit is a state write, and under fsync durability
// every Badger write is fsynced (logstore: SyncWrites is database-wide):
// committing every quarter of a window that an upstream's Receive Maximum
// had lowered to 20 cost 27 µs of CPU per record on top of the 20 µs of
// the rest of a drain (BenchmarkDrain, DRAIN_DURABILITY=fsync). The
// window bounds only what is unacknowledged upstream; what a crash sends
// again is what was sent and not committed: at most the window plus
// this batch.
func commitBatchOf(window int) int { return max(batchOf(window), minCommitBatch) }

// MaxResent is the most records of a stream a sink with this window
// sends again after a crash (a dropped connection: the window): the
// records sent and not under its durable position.
func MaxResent(window int) int { return window + commitBatchOf(window) }

// minCommitBatch is commitBatchOf's floor: the read-ahead, so a drain
// commits about once per read.
const minCommitBatch = readAhead

// commitInterval bounds how long acknowledged records wait to be
// committed while the pump is not caught up (a slow upstream, max_rate):
// the position, and the stall clock with it, moves at least that often.
const commitInterval = time.Second

// Batch is how many acknowledgements the pump of a connection with this
// window acts on at once (a quarter of it): a Conn may hand them over in
// groups that large (mqttsink does), as long as it hands over at once
// the acknowledgement that leaves nothing in flight.
func Batch(window int) int { return batchOf(window) }

// Keeper is a Conn that took over its predecessor's deliveries still in
// flight (an MQTT session resumed with QoS 2): it completes them itself,
// under the same ids, and the pump keeps its window instead of rewinding.
type Keeper interface {
	KeepsInflight() bool
}

// Resumer is a Conn whose upstream is its own checkpoint (Kafka with
// exactly-once): Resume returns what the upstream holds of stream from
// this sink, every record below Held.Next included; ok is false when it
// holds none.
type Resumer interface {
	Resume(ctx context.Context, stream string) (h Held, ok bool, err error)
}

// Held is the last record of a stream an upstream holds: the offset after
// it, and its timestamp (unix ms) and topic, by which the sink checks that
// it is the stream's own record at that offset (0 and "": not known).
type Held struct {
	Next  uint64
	Time  int64
	Topic string
}

// resumeWait bounds how long resume waits for a stream's watermark to
// reach what the upstream holds: a new leader's watermark may trail the
// old leader's for a fetch or two.
var resumeWait = 2 * time.Second

// resume moves each stream's position past what the upstream already
// holds, so a record acknowledged there but not yet committed here (a
// crash between the two) is not sent twice. It moves nothing when the
// upstream's last record is not the stream's record at that offset (the
// stream was deleted and created again, or lost records that were not
// yet durable): moving would skip the stream's own records there, and
// sending from the sink's position only sends some twice.
func (s *Sink) resume(ctx context.Context, r Resumer, cursors []*cursor) error {
	for _, c := range cursors {
		h, ok, err := r.Resume(ctx, c.name)
		if err != nil {
			return &stageError{reason: "resume", err: fmt.Errorf("read back %s from the upstream: %w", c.name, err)}
		}
		pos := c.position.Load()
		if !ok || h.Next <= pos {
			continue
		}
		if !holdsOwn(ctx, c.stream, h) {
			s.log.Warn("the upstream's last record of this stream is not the stream's record at that offset (deleted and created again?): sending from the sink's own position",
				attrStream, c.name, attrOffset, h.Next-1, attrEnd, c.stream.Committed(), attrFrom, pos)
			continue
		}
		next := h.Next
		if err := s.cfg.Positions.Commit(Group(s.cfg.Name), c.name, next); err != nil {
			return &stageError{reason: "commit", err: fmt.Errorf("commit %s at %d: %w", c.name, next, err)}
		}
		s.log.Info("sink resumes after the upstream's last record", attrStream, c.name, attrFrom, pos, attrTo, next)
		c.position.Store(next)
		c.moveTo(next)
		c.progressAt.Store(time.Now().UnixNano())
		c.m.committed.Set(float64(next))
	}
	return nil
}

// holdsOwn reports whether h's record is st's committed record at
// h.Next-1, waiting up to resumeWait for the watermark to reach it. A
// record retention has dropped, or an upstream that does not say its
// record's time, cannot be checked: it counts as st's.
func holdsOwn(ctx context.Context, st Stream, h Held) bool {
	deadline := time.Now().Add(resumeWait)
	for st.Committed() < h.Next {
		wait := time.Until(deadline)
		if wait <= 0 {
			return false
		}
		t := time.NewTimer(min(wait, 50*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-st.Changed():
		case <-t.C:
		}
		t.Stop()
	}
	if h.Time == 0 {
		return true
	}
	recs, err := st.Read(h.Next-1, 1, 0)
	if err != nil || len(recs) == 0 {
		return h.Next-1 < st.FirstOffset() // dropped by retention: nothing to check against
	}
	rec := recs[0]
	return rec.Offset == h.Next-1 && rec.Timestamp == h.Time && (h.Topic == "" || rec.Topic == h.Topic)
}

// pump sends over conn until it fails or ctx is done. A connection starts
// from the durable positions (the last one committed what it had
// acknowledged as it ended): whatever was in flight on the last one is
// read from the log and sent again (at most the window, hence the bound on
// duplicates), unless conn is a Keeper that keeps them.
// progressed reports that anything was acknowledged.
func (s *Sink) pump(ctx context.Context, conn Conn) (progressed bool, err error) {
	list := s.streams.Load()
	if k, ok := conn.(Keeper); !ok || !k.KeepsInflight() || s.inflight == nil {
		s.inflight = map[uint64]ref{}
		for _, c := range *list {
			if c.next > c.position.Load() {
				c.resendBelow = max(c.resendBelow, c.next)
			}
			c.moveTo(c.position.Load())
			c.slots = c.slots[:0]
		}
	} else {
		for id, r := range s.inflight { // streams removed while disconnected
			if !slices.Contains(*list, r.c) {
				delete(s.inflight, id)
			}
		}
	}
	if r, ok := conn.(Resumer); ok {
		var led []*cursor
		for _, c := range *list {
			if c.led {
				led = append(led, c)
			}
		}
		if err := s.resume(ctx, r, led); err != nil {
			return false, err
		}
	}
	p := &pumpState{conn: conn, window: max(conn.Window(), 1), inflight: s.inflight, cursors: *list, list: list}
	p.batch, p.commitEvery, p.committedAt = batchOf(p.window), commitBatchOf(p.window), time.Now()
	defer s.commitAcked(p)
	if s.cfg.MaxRate > 0 {
		p.rate = newBucket(s.cfg.MaxRate, time.Now())
	}
	acks := conn.Acks()
	watcher, _ := s.cfg.Positions.(Watcher)
	for {
		s.refresh(p)
		var leaderCh <-chan struct{} // nil (never ready) on a single node
		if s.cfg.Leadership != nil {
			leaderCh = s.cfg.Leadership.Changed() // before asking: a change from now on closes it
		}
		any, err := s.lead(ctx, p)
		if err != nil {
			return progressed, err
		}
		if !any {
			return progressed, errStandby
		}
		// Take the streams' wake-up channels before reading, so records
		// committed after a read wake the wait below.
		var changed, seeks []<-chan struct{}
		for _, c := range p.cursors {
			if !c.closed && c.led {
				changed = append(changed, c.stream.Changed())
			}
		}
		// A position moved from outside (Broker.CommitGroup) is a seek.
		if watcher != nil {
			for _, c := range p.cursors {
				if !c.led {
					continue
				}
				off, ok, ch := watcher.Watch(Group(s.cfg.Name), c.name)
				if ok && (off != c.watched || !c.watchedOK) && off != c.position.Load() {
					s.seek(c, off)
				}
				c.watched, c.watchedOK = off, ok
				seeks = append(seeks, ch)
			}
		}
		// 1. Take every acknowledgement already here.
		for drained := false; !drained; {
			select {
			case id, ok := <-acks:
				if !ok {
					return progressed, connErr(conn)
				}
				progressed = s.acked(p, id) || progressed
			default:
				drained = true
			}
		}
		// 2. Make the acknowledged prefix durable.
		pending, err := s.commit(p)
		if err != nil {
			return progressed, err
		}
		// 3. Send what the window and the rate allow.
		sent, read, wait, err := s.fill(ctx, p)
		if err != nil {
			return progressed, err
		}
		if sent > 0 {
			if err := conn.Flush(ctx); err != nil {
				return progressed, err
			}
		}
		if read {
			continue // look for acknowledgements, then read on
		}
		// 4. Wait for an acknowledgement, new records, the rate, or pause.
		cases := []reflect.SelectCase{
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(acks)},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.pauseWake)},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.streamsWake)},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(leaderCh)},
		}
		sleep := wait
		if pending {
			// Acknowledged records wait for a commit batch: not longer
			// than commitInterval.
			left := max(commitInterval-time.Since(p.committedAt), time.Millisecond)
			if sleep == 0 || left < sleep {
				sleep = left
			}
		}
		var timer *time.Timer
		if sleep > 0 {
			timer = time.NewTimer(sleep)
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)})
		}
		wake := seeks // a seek frees the window too
		if p.room() >= p.batch && !s.paused.Load() && wait == 0 {
			wake = append(wake, changed...)
		}
		for _, ch := range wake {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
		}
		chosen, v, ok := reflect.Select(cases)
		if timer != nil {
			timer.Stop()
		}
		switch chosen {
		case 0:
			return progressed, ctx.Err()
		case 1:
			if !ok {
				return progressed, connErr(conn)
			}
			progressed = s.acked(p, v.Uint()) || progressed
		}
	}
}

// room is how many more records may be sent: the window bounds those
// not acknowledged yet, and the window plus a commit batch those not
// under a durable position (acknowledged records wait there for the
// records below them, and for a commit), which a crash sends again.
func (p *pumpState) room() int {
	unacked, slots := 0, 0
	for _, c := range p.cursors {
		slots += len(c.slots)
		for _, sl := range c.slots {
			if !sl.acked {
				unacked++
			}
		}
	}
	return min(p.window-unacked, p.window+p.commitEvery-slots)
}

// refresh takes the sink's list of streams again if AddStream or
// RemoveStream changed it. A removed stream's records in flight leave the
// window; their late acknowledgements are ignored.
func (s *Sink) refresh(p *pumpState) {
	list := s.streams.Load()
	if list == p.list {
		return
	}
	for _, c := range p.cursors {
		if !slices.Contains(*list, c) {
			for _, sl := range c.slots {
				delete(p.inflight, sl.id)
			}
			c.slots = nil
		}
	}
	p.cursors, p.list = *list, list
}

// Watcher is Positions whose values may also change from outside the
// sink (a commit from inside the node, Broker.CommitGroup): Watch
// returns the durable position and a channel closed when it changes.
// The pump seeks when the value changes from the one it last saw and is
// not its own position: a value still stale when the sink takes a stream
// up (in a site, a broker that has not reloaded the stream's state yet)
// is not taken for a seek.
type Watcher interface {
	Watch(group, stream string) (off uint64, ok bool, changed <-chan struct{})
}

// seek continues c from off, set from outside: what is in flight in c is
// forgotten (late acknowledgements of it are ignored) and reading starts
// again at off, back or forward.
func (s *Sink) seek(c *cursor, off uint64) {
	s.log.Info("sink position moved from outside; continuing from there", attrStream, c.name,
		attrFrom, c.position.Load(), attrTo, off)
	for _, sl := range c.slots {
		delete(s.inflight, sl.id)
	}
	c.slots = c.slots[:0]
	c.moveTo(off)
	c.position.Store(off)
	c.progressAt.Store(time.Now().UnixNano())
	c.m.committed.Set(float64(off))
}

// connErr is why conn ended.
func connErr(conn Conn) error {
	if err := conn.Err(); err != nil {
		return err
	}
	return errors.New("connection closed")
}

// acked records the acknowledgement of delivery id.
func (s *Sink) acked(p *pumpState, id uint64) bool {
	r, ok := p.inflight[id]
	if !ok {
		return false
	}
	delete(p.inflight, id)
	i := sort.Search(len(r.c.slots), func(i int) bool { return r.c.slots[i].off >= r.off })
	if !r.c.ack(r.off) {
		return false
	}
	now := time.Now()
	s.m.ackLatency.Observe(now.Sub(r.c.slots[i].sentAt).Seconds())
	r.c.m.acked.Inc()
	r.c.lastSuccess.Store(now.UnixNano())
	return true
}

// commit moves each stream's position over its acknowledged prefix and
// makes it durable before the slots below it are forgotten. It waits for
// a batch of acknowledgements (commitBatchOf), unless a stream is caught
// up with everything it sent acknowledged: then its position is exact,
// so a sink whose traffic pauses shows (and keeps, across a restart)
// every record the upstream took. Nor does it wait longer than
// commitInterval. pending reports acknowledged records left uncommitted.
func (s *Sink) commit(p *pumpState) (pending bool, err error) {
	gain, exact := uint64(0), false
	for _, c := range p.cursors {
		if !c.led {
			continue // the stream's leader commits it
		}
		to := c.prefix()
		if to <= c.position.Load() {
			continue
		}
		gain += to - c.position.Load()
		exact = exact || to == c.next && len(c.ahead) == 0 && c.next >= c.stream.Committed()
	}
	if gain == 0 {
		return false, nil
	}
	if gain < uint64(p.commitEvery) && !exact && time.Since(p.committedAt) < commitInterval {
		return true, nil
	}
	return false, s.commitPrefix(p)
}

// commitAcked commits whatever is acknowledged when a pump ends, so the
// next connection starts after it rather than sending a commit batch
// again; a failure leaves the durable position as it was.
func (s *Sink) commitAcked(p *pumpState) {
	if err := s.commitPrefix(p); err != nil {
		s.log.Warn("sink: committing the acknowledged records at the connection's end", attrUpstream, s.cfg.Upstream.String(), attrErr, err)
	}
}

// commitPrefix makes each led stream's acknowledged prefix its durable
// position.
func (s *Sink) commitPrefix(p *pumpState) error {
	p.committedAt = time.Now()
	group := Group(s.cfg.Name)
	for _, c := range p.cursors {
		to := c.prefix()
		if !c.led || to <= c.position.Load() {
			continue
		}
		if err := s.cfg.Positions.Commit(group, c.name, to); err != nil {
			return &stageError{reason: "commit", err: fmt.Errorf("commit %s at %d: %w", c.name, to, err)}
		}
		i := sort.Search(len(c.slots), func(i int) bool { return c.slots[i].off >= to })
		c.slots = append(c.slots[:0], c.slots[i:]...)
		c.position.Store(to)
		c.progressAt.Store(time.Now().UnixNano())
		c.m.committed.Set(float64(to))
	}
	return nil
}

// fill reads and sends records while the window and the rate allow, one
// stream after another. wait > 0 is how long until the rate allows more.
// read reports that any stream moved on (records read or a gap skipped).
func (s *Sink) fill(ctx context.Context, p *pumpState) (sent int, read bool, wait time.Duration, err error) {
	if s.paused.Load() || s.holding() {
		return 0, false, 0, nil
	}
	n := len(p.cursors)
	if n == 0 {
		return 0, false, 0, nil
	}
	for k := 0; k < n; k++ {
		c := p.cursors[(p.rr+k)%n]
		if c.closed || !c.led {
			continue
		}
		room := p.room()
		if room < p.batch {
			break
		}
		if p.rate != nil {
			allowed, w := p.rate.take(room, time.Now())
			if allowed == 0 {
				return sent, read, w, nil
			}
			room = allowed
		}
		got, moved, err := s.sendFrom(ctx, p, c, room)
		sent += got
		read = read || moved
		if err != nil {
			return sent, read, 0, err
		}
		if p.rate != nil && got < room {
			p.rate.refund(room - got)
		}
	}
	p.rr = (p.rr + 1) % n
	return sent, read, 0, nil
}

// sendFrom sends up to room records of c from next, those the filter
// lets through, reading them from the log (readAhead at a time) when it
// has none read ahead; moved reports that next moved.
func (s *Sink) sendFrom(ctx context.Context, p *pumpState, c *cursor, room int) (sent int, moved bool, err error) {
	if len(c.ahead) == 0 || c.ahead[0].Offset != c.next {
		c.moveTo(c.next)
		recs, err := c.stream.Read(c.next, max(room, readAhead), s.cfg.ReadBytes)
		switch {
		case errors.Is(err, logstore.ErrOffsetOutOfRange):
			if s.uncommitted(c) {
				return 0, false, nil // Changed wakes the pump when the watermark moves
			}
			return 0, true, s.skipGap(c)
		case errors.Is(err, logstore.ErrClosed):
			c.closed = true
			s.log.Warn("sink stream closed", attrStream, c.name)
			return 0, false, nil
		case err != nil:
			return 0, false, &stageError{reason: "read", err: fmt.Errorf("read %s at %d: %w", c.name, c.next, err)}
		}
		c.ahead = append(c.ahead, recs...)
	}
	recs := c.ahead[:min(room, len(c.ahead))]
	now := time.Now() // one read's records go out together
	for i, r := range recs {
		if r.Offset != c.next { // not contiguous: read again from next
			recs = recs[:i]
			clear(c.ahead)
			c.ahead = c.ahead[:0]
			break
		}
		c.next = r.Offset + 1
		if s.cfg.Filter != "" && !logstore.MatchFilter(s.cfg.Filter, r.Topic) {
			continue
		}
		if s.origin != "" && source.Origin(r) == s.origin {
			c.m.echoes.Inc() // a source brought it down from this upstream: no echo
			continue
		}
		s.nextID++
		id := s.nextID
		c.slots = append(c.slots, slot{id: id, off: r.Offset, sentAt: now})
		p.inflight[id] = ref{c: c, off: r.Offset}
		if err := p.conn.Send(ctx, Delivery{ID: id, Stream: c.name, Record: r}); err != nil {
			c.dropSent(i + 1)
			return sent, true, err
		}
		sent++
		c.m.sent.Inc()
		if r.Offset < c.resendBelow {
			c.m.retried.Inc()
		}
	}
	c.dropSent(len(recs))
	return sent, len(recs) > 0, nil
}

// dropSent removes the first n records read ahead (sent or skipped).
func (c *cursor) dropSent(n int) {
	if n >= len(c.ahead) {
		clear(c.ahead)
		c.ahead = c.ahead[:0]
		return
	}
	clear(c.ahead[:n])
	c.ahead = c.ahead[n:]
}

// uncommitted reports that c's next record is in the replica's log but
// not committed yet: a new leader whose watermark has not caught up with
// a position its predecessor committed. The sink waits for it instead of
// moving the position back to the watermark.
func (s *Sink) uncommitted(c *cursor) bool {
	l, ok := c.stream.(interface{ NextOffset() uint64 })
	return ok && c.next > c.stream.Committed() && c.next <= l.NextOffset()
}

// skipGap handles a read below the log start (retention dropped records
// the sink had not sent) or above the end (a position from another log):
// never silently.
func (s *Sink) skipGap(c *cursor) error {
	first, end := c.stream.FirstOffset(), c.stream.Committed()
	switch {
	case c.next < first:
		lost := first - c.next
		c.m.lost.Add(float64(lost))
		s.log.Error("sink lost records: retention dropped them before they were sent",
			attrStream, c.name, attrFrom, c.next, attrTo, first-1, attrCount, lost)
		c.moveTo(first)
	case c.next > end:
		s.log.Error("sink position beyond the end of the stream; continuing from the end",
			attrStream, c.name, attrOffset, c.next, attrEnd, end)
		c.moveTo(end)
		if len(c.slots) == 0 && c.position.Load() > end {
			// commit moves positions forward only: set this one back here.
			if err := s.cfg.Positions.Commit(Group(s.cfg.Name), c.name, end); err != nil {
				return &stageError{reason: "commit", err: fmt.Errorf("commit %s at %d: %w", c.name, end, err)}
			}
			c.position.Store(end)
			c.m.committed.Set(float64(end))
		}
	}
	return nil
}

// stageError is an error of the sink's own (not the upstream's) with its
// reason for peat_sink_errors_total.
type stageError struct {
	reason string
	err    error
}

func (e *stageError) Error() string  { return e.err.Error() }
func (e *stageError) Unwrap() error  { return e.err }
func (e *stageError) Reason() string { return e.reason }

// bucket is a token bucket of records per second.
type bucket struct {
	rate, tokens, burst float64
	at                  time.Time
}

func newBucket(rate float64, now time.Time) *bucket {
	burst := max(1, rate/10)
	return &bucket{rate: rate, tokens: burst, burst: burst, at: now}
}

// take returns how many of want may go now, and if none, how long until one may.
func (b *bucket) take(want int, now time.Time) (int, time.Duration) {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
	b.at = now
	n := min(want, int(b.tokens))
	if n == 0 {
		return 0, time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
	}
	b.tokens -= float64(n)
	return n, 0
}

func (b *bucket) refund(n int) { b.tokens = min(b.burst, b.tokens+float64(n)) }
