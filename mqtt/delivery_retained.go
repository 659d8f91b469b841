package mqtt

import (
	"slices"
	"strings"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// Retained messages for a new subscription.
//
// A retained record of a captured topic must reach a new subscriber once:
// either among the retained messages it gets on subscribing, or live from
// the log, never both and never neither. So, per stream, the retained
// messages are a snapshot of the retained set at an offset (retained.go)
// and the subscription's live records start at that same offset; and the
// retained messages are queued before those live records, so a topic's
// newer value never arrives before its older one.
//
//	OnSubscribe    (the filter is not in mochi's index yet) for each filter
//	               that gets retained messages (not shared, not an
//	               extension, Retain Handling 0, or 1 for a new one), pause
//	               the client in every stream the filter reaches: the
//	               shared reader offers it nothing; a new filter gets a
//	               gate that keeps records matching only it from the
//	               client until its start is known
//	OnSubscribed   (the filter is in the index) under each reader's lock:
//	               ask for the snapshot at the committed offset, which is
//	               the filter's start in that stream; then let the client go
//	               on with a cursor of its own from where it was paused
//	cursor         queues each snapshot when the retained follower hands it
//	               over, then the records from where the client was paused,
//	               leaving out those below the start that only the new
//	               filter matches, and rejoins the shared reader once past
//	               the start
//
// A client paused with nothing dispatched meanwhile and an empty snapshot
// at hand goes live again at once, with no cursor.

// retainedWant is one filter of a SUBSCRIBE that gets retained messages.
type retainedWant struct {
	index   int // in the SUBSCRIBE's filters
	filter  string
	readers []*deliveryReader // of the streams the filter reaches
	gate    *retainedGate     // nil for a filter the client had already, or no reader
	// atParent: a filter "P/#", which also gets mochi's retained messages
	// at P's level, which mochi leaves out (parentlevel.go).
	atParent bool
}

// retainedGate keeps records that only a new filter matches from the
// client's cursors below the filter's start in each stream: the snapshot
// holds those. Guarded by the client's mu.
type retainedGate struct {
	from   map[string]uint64 // per stream; a stream not in it: no record yet
	passed map[string]bool   // streams whose cursor went past from
	left   int               // streams still to pass; at 0 the gate goes
}

// pendingRetained is a snapshot a member's cursor queues before its next
// record.
type pendingRetained struct {
	snap *retainedSnapshot
	sub  packets.Subscription // as granted
}

// wantsRetained reports whether sub gets the retained messages of captured
// topics: MQTT's Retain Handling, no shared subscription
// [MQTT-3.8.4-4 non-normative, 4.8.2], no extension topic.
func wantsRetained(cl *mochi.Client, sub packets.Subscription) bool {
	f := sub.Filter
	switch {
	case f == "", !mochi.IsValidFilter(f, false), mochi.IsSharedFilter(f),
		strings.HasPrefix(f, replayPrefix), strings.HasPrefix(f, groupPrefix), strings.HasPrefix(f, offsetsPrefix):
		return false
	case sub.RetainHandling == 2: // [MQTT-3.3.1-11]
		return false
	case sub.RetainHandling == 1: // [MQTT-3.3.1-10]
		_, existed := cl.State.Subscriptions.Get(f)
		return !existed
	}
	return true
}

// retainedSubscribe is OnSubscribe's part: it pauses the client in the
// streams the filters that get retained messages reach.
func (d *delivery) retainedSubscribe(cl *mochi.Client, pk packets.Packet) {
	if !d.retained.enabled() || cl.Net.Inline { // the inline client gets no record of a captured topic
		return
	}
	var wants []retainedWant
	var c *deliveryClient
	for i, sub := range pk.Filters {
		if !wantsRetained(cl, sub) {
			continue
		}
		readers := d.readersReached(sub.Filter)
		atParent := hasParentLevel(sub.Filter)
		if len(readers) == 0 && !atParent {
			continue // only topics no stream captures: mochi's own
		}
		if c == nil {
			if c = d.attach(cl); c == nil {
				return
			}
		}
		w := retainedWant{index: i, filter: sub.Filter, readers: readers, atParent: atParent}
		if _, existed := cl.State.Subscriptions.Get(sub.Filter); !existed && len(readers) > 0 {
			w.gate = &retainedGate{from: map[string]uint64{}, passed: map[string]bool{}, left: len(readers)}
		}
		wants = append(wants, w)
	}
	if len(wants) == 0 {
		return
	}
	c.mu.Lock()
	if c.mu.gates == nil {
		c.mu.gates = map[string]*retainedGate{}
	}
	if c.mu.wants == nil {
		c.mu.wants = map[uint16][]retainedWant{}
	}
	for _, w := range wants {
		if w.gate != nil {
			c.mu.gates[w.filter] = w.gate
		}
	}
	c.gated.Store(len(c.mu.gates) > 0)
	c.mu.wants[pk.PacketID] = wants
	c.mu.Unlock()
	for _, w := range wants {
		for _, r := range w.readers {
			r.pause(c)
		}
	}
}

// retainedSubscribed is OnSubscribed's part: it takes the snapshots and
// lets the paused client go on.
func (d *delivery) retainedSubscribed(cl *mochi.Client, pk packets.Packet, codes []byte) {
	c := d.client(cl)
	if c == nil {
		return
	}
	c.mu.Lock()
	wants := c.mu.wants[pk.PacketID]
	delete(c.mu.wants, pk.PacketID)
	c.mu.Unlock()
	if len(wants) == 0 {
		return
	}
	var paused []*deliveryReader
	var atParent []deliveryItem
	for _, w := range wants {
		granted := w.index < len(codes) && codes[w.index] < packets.ErrUnspecifiedError.Code
		sub := pk.Filters[w.index]
		if granted && w.atParent {
			atParent = append(atParent, d.retainedAtParent(c, sub, codes[w.index])...)
		}
		for _, r := range w.readers {
			if granted {
				sub.Qos = min(sub.Qos, codes[w.index])
				r.addRetained(c, w, sub)
			}
			if !slices.Contains(paused, r) {
				paused = append(paused, r)
			}
		}
		if !granted && w.gate != nil {
			c.removeGate(w.filter, w.gate)
		}
	}
	for _, r := range paused {
		r.resume(c)
	}
	if len(atParent) > 0 {
		d.goPush(c, atParent)
	}
}

// retainedAtParent builds the items of mochi's retained messages that
// sub, granted QoS qos, gets at its filter's parent level.
func (d *delivery) retainedAtParent(c *deliveryClient, sub packets.Subscription, qos byte) []deliveryItem {
	var items []deliveryItem
	sub.Qos = min(sub.Qos, qos)
	for _, pk := range d.parent.retained(sub.Filter) {
		it, ok := c.item(nil, sub, sub.Filter, retainedRecord(pk))
		if !ok {
			continue
		}
		it.retain = true // [MQTT-3.3.1-8]
		items = append(items, it)
	}
	return items
}

// goPush queues items to c from a goroutine of its own: the caller, a
// client's read goroutine, must not wait for room in c's queue.
func (d *delivery) goPush(c *deliveryClient, items []deliveryItem) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx.Err() != nil {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for _, it := range items {
			if c.push(c.ctx, it) != nil {
				return
			}
		}
	}()
}

// readersReached returns the readers of the streams that capture topics
// matching filter.
func (d *delivery) readersReached(filter string) []*deliveryReader {
	streams, err := streamsReached(d.log, filter)
	if err != nil {
		streams = d.log.Streams() // all of them: more pauses, never a missed one
	}
	var out []*deliveryReader
	for _, s := range streams {
		if r := d.reader(s.Name()); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// pause stops the shared reader offering c anything until resume; a cursor
// of c's that is running does not rejoin the reader meanwhile.
func (r *deliveryReader) pause(c *deliveryClient) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mu.members[c.id]
	if m == nil || m.c != c || m.paused {
		return
	}
	m.paused = true
	m.resumed = make(chan struct{})
	if m.live {
		m.live = false
		m.needCursor = true
		m.resumeAt = max(r.mu.dispatched, m.start)
	}
}

// addRetained asks for the snapshot of w's filter in r's stream, which
// fixes the filter's start there, and gives it to c's member to queue.
func (r *deliveryReader) addRetained(c *deliveryClient, w retainedWant, sub packets.Subscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mu.members[c.id]
	if m == nil || m.c != c || !m.paused {
		return
	}
	snap := r.d.retained.snapshot(r.stream, w.filter)
	if w.gate != nil {
		c.mu.Lock()
		w.gate.from[r.stream.Name()] = snap.at
		c.mu.Unlock()
	}
	m.retained = append(m.retained, pendingRetained{snap: snap, sub: sub})
	m.holdUntil = max(m.holdUntil, snap.at)
}

// resume ends pause: a member that was live goes on with a cursor from
// where it was paused (or live at once when nothing is to be queued and
// nothing was dispatched meanwhile); a running cursor is woken.
func (r *deliveryReader) resume(c *deliveryClient) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mu.members[c.id]
	if m == nil || m.c != c || !m.paused {
		return
	}
	m.paused = false
	close(m.resumed)
	if !m.needCursor {
		return
	}
	m.needCursor = false
	if r.mu.dispatched == m.resumeAt && snapshotsEmpty(m.retained) {
		// Nothing to queue first, nothing missed: the filters' records
		// are all live ones from here.
		name := r.stream.Name()
		c.mu.Lock()
		for _, g := range c.mu.gates {
			if _, ok := g.from[name]; ok {
				g.from[name] = m.resumeAt
			}
		}
		c.mu.Unlock()
		c.passGates(name, m.resumeAt)
		m.retained, m.live = nil, true
		return
	}
	r.d.wg.Add(1) // not a fallback: peat_mqtt_subscriber_fallbacks_total counts lagging subscribers
	go r.runClientCursor(m, m.resumeAt)
}

// snapshotsEmpty reports whether every snapshot is handed over and empty.
func snapshotsEmpty(ps []pendingRetained) bool {
	for _, p := range ps {
		select {
		case <-p.snap.ready:
			if len(p.snap.recs) > 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// retainedPrepLocked is catchUp's prepLocked for m's cursor: the offset it
// must reach before rejoining, the snapshots to queue first, and, while m
// is paused, a channel to wait on before rejoining.
func (r *deliveryReader) retainedPrepLocked(m *deliveryMember) (hold uint64, work func() error, wait <-chan struct{}) {
	if m.paused {
		wait = m.resumed
	}
	if len(m.retained) == 0 {
		return m.holdUntil, nil, wait
	}
	list := m.retained
	m.retained = nil
	return m.holdUntil, func() error { return r.queueRetained(m.c, list) }, wait
}

// queueRetained queues each snapshot's records, flagged retained, once the
// retained follower has handed it over.
func (r *deliveryReader) queueRetained(c *deliveryClient, list []pendingRetained) error {
	for _, p := range list {
		select {
		case <-p.snap.ready:
		case <-c.ctx.Done():
			return c.ctx.Err()
		case <-r.ctx.Done():
			return r.ctx.Err()
		}
		for _, rec := range p.snap.recs {
			it, ok := c.item(r, p.sub, p.sub.Filter, rec)
			if !ok {
				continue
			}
			it.retain = true // [MQTT-3.3.1-8]
			if err := c.push(c.ctx, it); err != nil {
				return err
			}
		}
	}
	return nil
}

// passesGates reports whether rec of stream may go to c: some filter of
// c's that matches it is not held back by its gate.
func (c *deliveryClient) passesGates(stream string, rec *logstore.Record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	held := false
	for f := range c.cl.State.Subscriptions.GetAll() {
		if !logstore.MatchFilter(f, rec.Topic) {
			continue
		}
		g := c.mu.gates[f]
		if g == nil {
			return true
		}
		if from, ok := g.from[stream]; ok && rec.Offset >= from {
			return true
		}
		held = true
	}
	return !held
}

// passGates notes that c's cursor in stream went past next: gates whose
// start there is at or below it are done with that stream.
func (c *deliveryClient) passGates(stream string, next uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for f, g := range c.mu.gates {
		if from, ok := g.from[stream]; ok && from <= next && !g.passed[stream] {
			g.passed[stream] = true
			if g.left--; g.left <= 0 {
				delete(c.mu.gates, f)
			}
		}
	}
	c.gated.Store(len(c.mu.gates) > 0)
}

// removeGate drops g, the gate of filter (refused, or unsubscribed).
func (c *deliveryClient) removeGate(filter string, g *retainedGate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g == nil || c.mu.gates[filter] == g {
		delete(c.mu.gates, filter)
	}
	c.gated.Store(len(c.mu.gates) > 0)
}
