package mqtt

import (
	"context"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/peatmq/peat/logstore"
)

// deliveryRetryDelay is how long a reader or cursor waits before reading
// again after a read error, or after a wakeup that found nothing new (a
// closed stream keeps its Changed channel closed).
// A variable for tests only.
var deliveryRetryDelay = 250 * time.Millisecond

// deliveryReader is the one shared reader of a stream on this node. It
// dispatches each committed record, in offset order, to the live members
// whose subscriptions match it, and to one member of each matching $share
// group.
type deliveryReader struct {
	d         *delivery
	stream    Stream
	delivered prometheus.Counter
	// ctx ends with the delivery, or when the stream is removed
	// (delivery_streams.go): the reader and its cursors stop.
	ctx    context.Context
	cancel context.CancelFunc
	// retainedDone is closed when the stream's retained follower has
	// stopped (retained.go), after ctx ends.
	retainedDone <-chan struct{}

	mu struct {
		sync.Mutex
		members map[string]*deliveryMember // by client id
		groups  map[string]*deliveryGroup  // by shared filter, "$share/<group>/<filter>"
		// dispatched is the offset after the last record dispatched: live
		// members have been offered every matching record below it.
		dispatched uint64
	}
}

// deliveryMember is a client's place in one stream's reader.
type deliveryMember struct {
	c *deliveryClient
	// live members get records at or above start from the reader; a member
	// that is not live is being fed by its own cursor.
	live  bool
	start uint64
	// prog follows a durable session's acknowledgements in this stream,
	// and rs marks its resends (resend.go); nil for other clients.
	prog    *progress
	rs      *resends
	untrack func() // hands rs's mark to the session

	// Retained messages for new subscriptions (delivery_retained.go).
	// paused: between OnSubscribe and OnSubscribed; resumed is closed when
	// it ends. needCursor: the member was live when paused, at resumeAt.
	paused     bool
	resumed    chan struct{}
	needCursor bool
	resumeAt   uint64
	// retained are the snapshots its cursor queues before its next record;
	// holdUntil is the highest filter start: it rejoins no lower.
	retained  []pendingRetained
	holdUntil uint64
}

// deliveryGroup is a $share group's place in one stream's reader.
type deliveryGroup struct {
	key  string
	live bool // false while a group cursor places the group's records
	next int  // round-robin position among the group's members
}

func newDeliveryReader(d *delivery, s Stream) *deliveryReader {
	r := &deliveryReader{
		d:         d,
		stream:    s,
		delivered: d.m.Delivered.WithLabelValues(s.Name()),
	}
	r.ctx, r.cancel = context.WithCancel(d.ctx)
	r.mu.dispatched = s.Committed()
	r.mu.members = map[string]*deliveryMember{}
	r.mu.groups = map[string]*deliveryGroup{}
	return r
}

// join makes c a live member, starting at the stream's committed offset.
// A durable client with a stored offset below it starts there instead,
// with a cursor of its own that rejoins the reader once it has caught up.
func (r *deliveryReader) join(c *deliveryClient) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &deliveryMember{c: c, live: true, start: r.stream.Committed()}
	if c.durable {
		from := m.start
		name := r.stream.Name()
		key := cursorKey{stream: name}
		if off, ok := r.d.sessions.offset(c.id, key); ok && off < from {
			from = off
		}
		m.prog = newProgress(from, func(v uint64) { r.d.sessions.advance(c.id, key, v) })
		var prev *resends // a connection taken over, still here
		if old := r.mu.members[c.id]; old != nil {
			prev = old.rs
		}
		m.rs, m.untrack = r.d.sessions.track(c.id, key, prev)
		// A new session's position is where it starts: records written
		// while it is offline, before it got any, are still its to get.
		r.d.sessions.advance(c.id, key, from)
		if from < m.start {
			m.live = false
			r.d.logger.Debug("delivery: durable session resumes from its stored offset",
				attrClient, c.id, attrStream, name, attrOffset, from)
			r.d.wg.Add(1)
			go r.runClientCursor(m, from)
		}
	}
	r.mu.members[c.id] = m
}

// leave removes c, unless a newer connection with the same client id has
// taken its place, and leaves the session the mark of what c was written
// (resend.go).
func (r *deliveryReader) leave(c *deliveryClient) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.mu.members[c.id]; m != nil && m.c == c {
		delete(r.mu.members, c.id)
		if m.untrack != nil {
			m.untrack()
		}
	}
}

// run is the reader's loop; it returns when the delivery closes.
func (r *deliveryReader) run() {
	defer r.d.wg.Done()
	ctx := r.ctx
	r.mu.Lock()
	k := newDeliveryCursor(r.d, r.stream, r.mu.dispatched) // set by newDeliveryReader, before any join
	r.mu.Unlock()
	for {
		changed := r.stream.Changed() // before reading Committed: no advance is missed
		from := k.next
		if err := r.step(k); err != nil {
			if !k.retry(ctx, err) {
				return
			}
			continue
		}
		if k.next == from && !k.wait(ctx, changed) {
			return
		}
	}
}

// step reads and dispatches one batch with k, the reader's cursor, and
// keeps the dispatched offset at k.next.
func (r *deliveryReader) step(k *deliveryCursor) error {
	committed := r.stream.Committed()
	r.mu.Lock()
	switch {
	case committed < k.next: // truncated below what was dispatched
		k.moveTo(committed)
		r.truncatedLocked(committed)
		r.mu.Unlock()
		return nil
	case k.next < committed && len(r.mu.members) == 0: // nobody to deliver to: skip ahead
		k.moveTo(committed)
		r.mu.dispatched = committed
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()

	recs, err := k.read(committed)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range recs {
		r.dispatchLocked(rec)
	}
	r.mu.dispatched = k.next
	if len(recs) > 0 {
		for _, m := range r.mu.members {
			if m.prog != nil && m.live {
				m.prog.scan(r.mu.dispatched)
			}
		}
	}
	return nil
}

// truncatedLocked follows the log back to end after a truncation.
func (r *deliveryReader) truncatedLocked(end uint64) {
	r.mu.dispatched = end
	for _, m := range r.mu.members {
		m.start = min(m.start, end)
		m.resumeAt = min(m.resumeAt, end)
		m.holdUntil = min(m.holdUntil, end)
	}
}

// dispatchLocked offers rec to every live member and group it matches.
func (r *deliveryReader) dispatchLocked(rec *logstore.Record) {
	subs := r.d.subs.subscribers(r.stream.Name(), rec)
	for id, sub := range subs.Subscriptions {
		m := r.mu.members[id]
		if m == nil || !m.live || rec.Offset < m.start {
			continue
		}
		it, ok := m.c.item(r, sub, sub.Filter, rec)
		if !ok {
			continue
		}
		if m.prog != nil {
			it.settle = m.prog.track(rec.Offset)
			it.rs = m.rs
		}
		if m.c.offer(it) {
			continue
		}
		if m.prog != nil {
			m.prog.untrack() // the cursor tracks it again when it queues it
		}
		// QoS 0 too: a burst larger than the queue must not lose messages
		// a client reading at full speed would take. The cursor drops QoS 0
		// records only once it lags more than QoS0MaxLag.
		r.fallBackLocked(m, rec.Offset)
	}
	for key, shared := range subs.Shared {
		r.dispatchSharedLocked(key, shared, rec)
	}
}

// dispatchSharedLocked offers rec to one member of a $share group, round
// robin among the members with room in their queue.
func (r *deliveryReader) dispatchSharedLocked(key string, shared map[string]packets.Subscription, rec *logstore.Record) {
	g := r.mu.groups[key]
	if g == nil {
		g = &deliveryGroup{key: key, live: true}
		r.mu.groups[key] = g
	}
	if !g.live {
		return
	}
	cands := r.candidatesLocked(g, shared, rec)
	for _, cand := range cands {
		if cand.c.offer(cand.it) {
			g.next++
			return
		}
	}
	if len(cands) == 0 {
		return // no member connected: nobody to deliver to, as in mochi
	}
	var qos byte
	for _, cand := range cands {
		qos = max(qos, cand.it.qos)
	}
	if qos == 0 {
		r.d.dropSlowQoS0.Inc()
		return
	}
	g.live = false
	r.d.m.CursorCatchup.Inc()
	r.d.logger.Debug("delivery: shared group fell behind; reading with its own cursor",
		attrGroup, key, attrStream, r.stream.Name(), attrOffset, rec.Offset)
	r.d.wg.Add(1)
	go r.runGroupCursor(g, rec.Offset)
}

// deliveryCandidate is a group member that could take a record.
type deliveryCandidate struct {
	c  *deliveryClient
	it deliveryItem
}

// candidatesLocked lists the connected members of a group, in round-robin
// order starting at the group's next position.
func (r *deliveryReader) candidatesLocked(g *deliveryGroup, shared map[string]packets.Subscription, rec *logstore.Record) []deliveryCandidate {
	ids := make([]string, 0, len(shared))
	for id := range shared {
		if r.mu.members[id] != nil {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Strings(ids)
	start := g.next % len(ids)
	cands := make([]deliveryCandidate, 0, len(ids))
	for _, id := range slices.Concat(ids[start:], ids[:start]) {
		c := r.mu.members[id].c
		if it, ok := c.item(r, shared[id], sharedFilter(shared[id].Filter), rec); ok {
			cands = append(cands, deliveryCandidate{c: c, it: it})
		}
	}
	return cands
}

// fallBackLocked takes m off the shared reader: a cursor of its own reads
// the stream from offset from and rejoins when it has caught up.
func (r *deliveryReader) fallBackLocked(m *deliveryMember, from uint64) {
	m.live = false
	r.d.m.CursorCatchup.Inc()
	r.d.logger.Debug("delivery: subscriber fell behind; reading with its own cursor",
		attrClient, m.c.id, attrStream, r.stream.Name(), attrOffset, from)
	r.d.wg.Add(1)
	go r.runClientCursor(m, from)
}

// deliverySubIDs returns the subscription identifiers to send, sorted
// ([MQTT-3.3.4-3]); mochi's merged subscriptions carry them in Identifiers.
func deliverySubIDs(sub packets.Subscription) []int {
	var ids []int
	for _, id := range sub.Identifiers {
		if id > 0 {
			ids = append(ids, id)
		}
	}
	if len(sub.Identifiers) == 0 && sub.Identifier > 0 {
		ids = append(ids, sub.Identifier)
	}
	sort.Ints(ids)
	return ids
}

// yieldToLive is called by a loop that reads history (a $replay or $group
// tap, a lagging client's cursor) after each batch it has queued. Such a
// loop and its client's sender hand the CPU to each other through the
// client's queue for as long as the history lasts. With one P (a one-core
// board, or a broker pinned to a core) Go's scheduler then runs what sits
// in its global run queue only once in 61 scheduling rounds
// (runtime/proc.go, findRunnable: "two goroutines can completely occupy
// the local runqueue by constantly respawning each other"), and that is
// where the netpoller puts the goroutines of clients whose packets arrived.
// Ten publishers' packets then waited up to ten such turns each. Gosched
// puts the loop at the back of the global queue, behind them. A QoS 0
// fan-in at 10k msg/s beside a 1M-record QoS 0 replay, broker on one core
// (PROFILES=server LOAD_RATE=10000 LOAD_FOR=10s scripts/bench-replay.sh,
// 3 runs each): the fan-in's end-to-end p50 / p99 while the replay ran
// went from 38-82 / 155-366 ms to 6-7 / 20-27 ms (1 / 7 ms without a
// replay), and the replay beside it from 380-433k to 479-618k msg/s; a
// replay alone ran as fast as before, within the runs' spread.
func yieldToLive() { runtime.Gosched() }

// deliverySleep waits d or until ctx is done; it reports false on ctx.
func deliverySleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
