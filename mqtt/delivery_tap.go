package mqtt

import (
	"context"
	"fmt"
	"strconv"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// A tap is one extension subscription of one client ($replay, $group,
// $offsets). Replay and group taps are cursors of their own: they read the
// stream from their start offset in bounded batches, keep the records whose
// topic matches the filter, and push them into the client's queue, waiting
// for room (never dropping). At the log's end they wait for the stream to
// advance and go on reading: history and live are one loop over one
// cursor, so the hand-over has no gap and no duplicate. Memory is bounded
// by the read batch and the client's queue, whatever the history's length.
//
// A group tap also tracks its consumer's acknowledgements (progress) and
// advances the group's committed offset. An $offsets tap delivers a group's
// committed offset each time it becomes durable.
type tap struct {
	d      *delivery
	c      *deliveryClient
	filter string // as subscribed
	ext    extFilter
	sub    packets.Subscription
	r      *deliveryReader // the stream; nil for $offsets
	start  uint64
	notice string    // why start is not what the client asked for
	group  groupKey  // $group, $offsets
	prog   *progress // $group, and a durable session's $replay
	// rs marks a durable session's resends in a $replay (resend.go);
	// untrack hands its mark to the session when the tap ends.
	rs      *resends
	untrack func()
	// clients: the SUBSCRIBE asked for each record's publisher
	// (propClient); each delivery shows it if the ACL allows.
	clients bool

	ctx    context.Context
	cancel context.CancelFunc
	seek   chan uint64 // 1-buffered: the latest commit to $offsets while this tap owns the group
}

func newTap(c *deliveryClient, sub packets.Subscription, ext extFilter) *tap {
	t := &tap{d: c.d, c: c, filter: sub.Filter, ext: ext, sub: sub, seek: make(chan uint64, 1)}
	t.ctx, t.cancel = context.WithCancel(c.ctx)
	return t
}

// seekTo makes the tap continue from off, dropping an earlier seek it has
// not yet seen.
func (t *tap) seekTo(off uint64) {
	for {
		select {
		case t.seek <- off:
			return
		default:
		}
		select {
		case <-t.seek:
		default:
		}
	}
}

// stop ends the tap; its goroutine exits on its own.
func (t *tap) stop() { t.cancel() }

// run is the tap's goroutine.
func (t *tap) run() {
	t.d.taps.Add(1)
	defer t.d.wg.Done()
	defer t.d.panics.catch(t.c.cl, "tap")
	defer t.d.taps.Add(-1)
	defer t.cancel()
	if t.untrack != nil {
		defer t.untrack()
	}
	if t.ext.kind == extGroup {
		defer t.d.groups.release(t.group, t)
	}
	if t.ext.kind == extOffsets {
		t.runOffsets()
		return
	}
	t.runLog()
}

// runLog feeds the client from the stream, from t.start on.
func (t *tap) runLog() {
	s := t.r.stream
	k := newDeliveryCursor(t.d, s, t.start, attrClient, t.c.id, attrFilter, t.filter)
	for t.ctx.Err() == nil {
		select {
		case off := <-t.seek:
			k.moveTo(off)
			t.prog.reset(off)
			t.d.groups.sought(t.group, t)
		default:
		}
		changed := s.Changed() // before Committed: no advance is missed
		from := k.next
		recs, err := k.read(s.Committed())
		if err != nil {
			if !k.retry(t.ctx, err) {
				return
			}
			continue
		}
		for _, rec := range recs {
			if err := t.place(rec); err != nil {
				return
			}
		}
		if t.prog != nil {
			t.prog.scan(k.next)
		}
		if k.next != from {
			yieldToLive()
			continue
		}
		if !k.pause(t.ctx, changed) {
			return
		}
		select {
		case <-changed:
			k.woken = true
		case off := <-t.seek:
			t.seekTo(off) // handled at the top of the loop
		case <-t.ctx.Done():
			return
		}
	}
}

// place pushes rec to the client when it matches the filter.
func (t *tap) place(rec *logstore.Record) error {
	if !logstore.MatchFilter(t.ext.inner, rec.Topic) {
		return nil
	}
	it, ok := t.c.item(t.r, t.sub, t.ext.inner, rec)
	if !ok {
		return nil
	}
	it.ext = &t.ext
	it.rs = t.rs
	it.client = t.clients && rec.ClientID != "" && t.c.mayReadClientID(rec.ClientID)
	if t.prog != nil {
		it.settle = t.prog.track(rec.Offset)
	}
	return t.c.push(t.ctx, it)
}

// runOffsets delivers the group's durable committed offset, now and on
// every change. A group that never committed has nothing to deliver yet.
func (t *tap) runOffsets() {
	var last uint64
	sent := false
	for {
		off, ok, changed := t.d.groups.watch(t.group)
		if ok && (!sent || off != last) {
			rec := &logstore.Record{Topic: t.filter, Payload: []byte(strconv.FormatUint(off, 10)), QoS: 1}
			it := deliveryItem{rec: rec, qos: min(t.sub.Qos, 1, t.d.maxQoS())}
			if t.c.push(t.ctx, it) != nil {
				return
			}
			last, sent = off, true
		}
		select {
		case <-changed:
		case <-t.ctx.Done():
			return
		}
	}
}

// User properties of MQTT 5 deliveries and SUBACKs of the replay protocol.
const (
	propStream    = "stream"    // deliveries, SUBACK: the stream's name
	propOffset    = "offset"    // deliveries: the record's offset
	propTimestamp = "timestamp" // deliveries: the record's time, unix ms
	propStart     = "start"     // SUBACK: the first offset the subscription reads
	propEnd       = "end"       // SUBACK: the stream's committed end when subscribed: offsets below it are history
	propNotice    = "notice"    // SUBACK: something the client should know (a <from> below the log start)
	// propClient is the publisher's client id, which a $replay or $group
	// delivery shows only when asked: a SUBSCRIBE with the user property
	// client "true" gets it in the SUBACK (this Peat knows the request),
	// then after timestamp on each delivery whose publisher's id the
	// ACL lets the subscriber see (Access.MayReadClientID).
	propClient = "client"
)

// asksClients reports whether a SUBSCRIBE's user properties ask for each
// record's publisher (propClient).
func asksClients(user []packets.UserProperty) bool {
	for _, u := range user {
		if u.Key == propClient && u.Val == "true" {
			return true
		}
	}
	return false
}

// tapError is a refused extension subscription: its SUBACK reason code and
// reason string.
type tapError struct {
	code   byte
	reason string
}

func (e *tapError) Error() string { return fmt.Sprintf("0x%02x %s", e.code, e.reason) }
