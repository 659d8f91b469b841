package mqtt

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// ackEntry is one QoS 1/2 publish (or refusal) awaiting its answer, in the
// client's ack queue.
type ackEntry struct {
	id   uint16
	qos  byte
	done bool         // the answer is known
	code packets.Code // CodeSuccess, or the refusal
	// placeholder: ingest put a PUBREC for id into the client's Inflight.
	placeholder bool
	// flow: the publish opened an inbound QoS 1/2 flow (a resend does not),
	// counted in the client's Receive Maximum until answered (QoS 2 with
	// success: until PUBREL).
	flow bool
	// orig is the entry a resent QoS 2 PUBLISH duplicates (nil when that one
	// is already answered): the resend gets the same answer.
	orig *ackEntry
}

// ingestConn is the ingest state of one connected client.
type ingestConn struct {
	h     *ingest
	cl    *mochi.Client
	space chan struct{} // 1-buffered: a window slot was freed
	ready chan struct{} // 1-buffered: an entry got its answer

	mu struct {
		sync.Mutex
		used     int                  // window slots taken: pending appends and unanswered entries
		queue    []*ackEntry          // in arrival order
		draining bool                 // an ack drainer runs
		qos2     map[uint16]*ackEntry // unanswered QoS 2 publishes by packet id
		refusing bool                 // a v3 client being disconnected for a refusal
		will     *will                // a will on a captured topic, taken from mochi
		flows    int                  // open inbound QoS 1/2 flows: the count Receive Maximum bounds
		awaitRel map[uint16]bool      // QoS 2 flows whose PUBREC went out, until PUBREL
	}
}

func newIngestConn(h *ingest, cl *mochi.Client) *ingestConn {
	return &ingestConn{
		h:     h,
		cl:    cl,
		space: make(chan struct{}, 1),
		ready: make(chan struct{}, 1),
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *ingestConn) v5() bool { return c.cl.Properties.ProtocolVersion == 5 }

// receiveFull reports whether the client has as many QoS 1/2 flows open
// as the Receive Maximum Peat announced (Window).
func (c *ingestConn) receiveFull() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.flows >= c.h.cfg.Window
}

// pubrel ends the QoS 2 flow id when its PUBREC went out from ingest.
func (c *ingestConn) pubrel(id uint16) {
	c.mu.Lock()
	if c.mu.awaitRel[id] {
		delete(c.mu.awaitRel, id)
		c.mu.flows--
	}
	c.mu.Unlock()
}

// acquire takes a window slot, blocking the client's read goroutine while
// Window publishes are pending. It returns false when the broker closes.
func (c *ingestConn) acquire() bool {
	for {
		c.mu.Lock()
		if c.mu.used < c.h.cfg.Window {
			c.mu.used++
			c.mu.Unlock()
			return true
		}
		c.mu.Unlock()
		select {
		case <-c.space:
		case <-c.h.closing:
			return false
		}
	}
}

func (c *ingestConn) release() {
	c.mu.Lock()
	c.mu.used--
	c.mu.Unlock()
	poke(c.space)
}

// enqueue adds e to the ack queue and makes sure a drainer runs. Called with
// c.mu held.
func (c *ingestConn) enqueueLocked(e *ackEntry) {
	c.mu.queue = append(c.mu.queue, e)
	if !c.mu.draining && c.h.goOwned(c.drain) {
		c.mu.draining = true
	}
}

// publish appends a publish on a captured topic; QoS 1/2 ones are answered
// by the drainer once the append completes.
func (c *ingestConn) publish(st Stream, pk *packets.Packet) {
	if !c.reserveSlot() {
		return // being disconnected, or the broker is closing: no ack, the client resends
	}
	e := c.expectAnswer(pk)
	rec := recordOf(c.cl.ID, pk)
	st.AppendAsync([]*logstore.Record{rec}, func(_ uint64, err error) {
		c.h.appended(st, err)
		code := packets.CodeSuccess
		if err != nil {
			code = refusalCode(err)
		}
		c.complete(e, code)
	})
}

// commitOffset commits (seeks) a consumer group's offset published to
// $offsets/<group>/<stream>; QoS 1/2 ones are answered once it is durable.
func (c *ingestConn) commitOffset(pk *packets.Packet) {
	ext, err := parseOffsetsTopic(pk.TopicName)
	var st Stream
	if err == nil {
		if st = c.h.stream(ext.stream); st == nil {
			err = fmt.Errorf("no stream %q", ext.stream)
		}
	}
	if err != nil {
		c.refuse(pk, packets.Code{Code: packets.ErrTopicNameInvalid.Code, Reason: err.Error()}, ReasonBadCommit)
		return
	}
	if reservedGroup(ext.group) { // tenancy.go; with Auth, the ACL check refused it already
		c.refuse(pk, packets.Code{Code: packets.ErrNotAuthorized.Code, Reason: reservedGroupReason(ext.group)}, ReasonNotAuthorized)
		return
	}
	off, notice, err := commitOffsetOf(pk.Payload, st) // groups.go: what is refused, what is clamped, and why
	if err != nil {
		c.refuse(pk, packets.Code{Code: codeBadOffset.Code, Reason: err.Error()}, ReasonBadCommit)
		return
	}
	if notice != "" {
		c.h.logger.Info("consumer group commit moved: "+notice, slog.String(attrClient, c.cl.ID), slog.String(attrGroup, ext.group))
	}
	if !c.reserveSlot() {
		return
	}
	e := c.expectAnswer(pk)
	key := groupKey{group: ext.group, stream: ext.stream}
	c.h.groups.commit(key, off, func(err error) {
		code := packets.CodeSuccess
		if err != nil {
			code = codeNotSaved
		}
		c.complete(e, code)
	})
	c.h.logger.Info("consumer group offset committed by publish", slog.String(attrClient, c.cl.ID),
		slog.String(attrGroup, ext.group), slog.String(attrStream, ext.stream), slog.Uint64(attrOffset, off))
}

// expectAnswer queues the ack entry of a QoS 1/2 publish that holds a
// window slot; nil for QoS 0.
func (c *ingestConn) expectAnswer(pk *packets.Packet) *ackEntry {
	qos := pk.FixedHeader.Qos
	if qos == 0 {
		return nil
	}
	e := &ackEntry{id: pk.PacketID, qos: qos, flow: true}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.flows++
	if qos == 2 {
		// Reserve the id in the Inflight map mochi shares between inbound
		// and outbound ids, so delivery cannot take it, and so mochi's
		// processPubrel finds it and answers PUBCOMP.
		c.setPlaceholder(pk.PacketID)
		e.placeholder = true
		if c.mu.qos2 == nil {
			c.mu.qos2 = map[uint16]*ackEntry{}
		}
		c.mu.qos2[pk.PacketID] = e
	}
	c.enqueueLocked(e)
	return e
}

// complete answers e, or frees the window slot of a QoS 0 publish (nil e).
func (c *ingestConn) complete(e *ackEntry, code packets.Code) {
	if e == nil {
		c.release()
		return
	}
	c.answer(e, code)
}

// answer records the outcome of e and wakes the drainer.
func (c *ingestConn) answer(e *ackEntry, code packets.Code) {
	c.mu.Lock()
	e.done, e.code = true, code
	c.mu.Unlock()
	poke(c.ready)
}

// refuse answers a publish that will not be stored, in queue order. QoS 0
// refusals are only counted.
func (c *ingestConn) refuse(pk *packets.Packet, code packets.Code, reason string) {
	c.h.m.Refused.WithLabelValues(reason).Inc()
	if pk.FixedHeader.Qos == 0 || !c.reserveSlot() {
		return
	}
	c.mu.Lock()
	c.mu.flows++
	c.enqueueLocked(&ackEntry{id: pk.PacketID, qos: pk.FixedHeader.Qos, done: true, code: code, flow: true})
	c.mu.Unlock()
}

// resentQoS2 answers a resent QoS 2 PUBLISH without appending it again:
// with the original's answer once that is known.
func (c *ingestConn) resentQoS2(id uint16) {
	if !c.reserveSlot() {
		return
	}
	c.mu.Lock()
	c.enqueueLocked(&ackEntry{id: id, qos: 2, done: true, code: packets.CodeSuccess, orig: c.mu.qos2[id]})
	c.mu.Unlock()
}

// reserveSlot takes a window slot for a publish worth answering: false when the
// client is being disconnected for a refusal or the broker is closing.
func (c *ingestConn) reserveSlot() bool {
	if !c.acquire() {
		return false
	}
	c.mu.Lock()
	refusing := c.mu.refusing
	c.mu.Unlock()
	if refusing {
		c.release()
		return false
	}
	return true
}

// drain writes the answers at the head of the queue as they become known,
// in arrival order, and ends when the queue is empty.
func (c *ingestConn) drain() {
	defer c.h.panics.catch(c.cl, "ack drainer")
	var batch []*ackEntry
	for {
		c.mu.Lock()
		n := 0
		for n < len(c.mu.queue) && c.mu.queue[n].done {
			n++
		}
		if n == 0 {
			if len(c.mu.queue) == 0 {
				c.mu.draining = false
				c.mu.queue = nil // drop the backing array of a burst
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			select {
			case <-c.ready:
				continue
			case <-c.h.closing:
				c.mu.Lock()
				c.mu.draining = false
				c.mu.Unlock()
				return
			}
		}
		batch = append(batch[:0], c.mu.queue[:n]...)
		clear(c.mu.queue[:n])
		c.mu.queue = c.mu.queue[n:]
		for _, e := range batch {
			if e.qos == 2 && e.orig == nil && c.mu.qos2[e.id] == e {
				delete(c.mu.qos2, e.id)
			}
		}
		c.mu.Unlock()
		// One write for the whole batch: a group commit completes many.
		_ = corked(c.cl, func() {
			for _, e := range batch {
				c.finish(e)
			}
		})
	}
}

// finish writes the answer to one entry and frees its window slot.
func (c *ingestConn) finish(e *ackEntry) {
	defer c.release()
	c.mu.Lock()
	code, placeholder := e.code, e.placeholder
	if e.orig != nil {
		code = e.orig.code // answered before e: it is ahead in the queue
	}
	if e.flow {
		// Before the answer is written: the client may send its next
		// publish as soon as it reads it.
		if e.qos == 2 && code.Code < packets.ErrUnspecifiedError.Code {
			if c.mu.awaitRel == nil {
				c.mu.awaitRel = map[uint16]bool{}
			}
			c.mu.awaitRel[e.id] = true // open until PUBREL
		} else {
			c.mu.flows--
		}
	}
	c.mu.Unlock()
	if code.Code >= packets.ErrUnspecifiedError.Code && placeholder {
		c.dropPlaceholder(e.id)
	}
	if code.Code >= packets.ErrUnspecifiedError.Code && !c.v5() {
		// MQTT 3 has no negative ack: close the connection so the client
		// knows the publish was not taken (mochi fires its will).
		c.mu.Lock()
		first := !c.mu.refusing
		c.mu.refusing = true
		c.mu.Unlock()
		if first {
			c.h.logger.Info("disconnecting MQTT 3 client: publish refused",
				slog.String(attrClient, c.cl.ID), slog.String(attrReason, code.Reason))
			c.cl.Stop(code)
		}
		return
	}
	typ := byte(packets.Puback)
	if e.qos == 2 {
		typ = packets.Pubrec
	}
	var err error
	if code.Code == packets.CodeSuccess.Code {
		var b [4]byte
		err = writeDirect(c.h.srv, c.cl, appendAck(b[:0], typ, e.id), false)
	} else {
		ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, PacketID: e.id, ReasonCode: code.Code}
		if code.Code >= packets.ErrUnspecifiedError.Code {
			ack.Properties.ReasonString = code.Reason
		}
		err = c.cl.WritePacket(ack)
	}
	if err != nil {
		c.h.logger.Debug("writing ack", slog.String(attrClient, c.cl.ID), slog.Any(attrErr, err))
	}
}

// setPlaceholder puts ingest's PUBREC for id into the client's Inflight.
func (c *ingestConn) setPlaceholder(id uint16) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Pubrec},
		PacketID:    id,
		Created:     time.Now().Unix(),
		Origin:      ingestOrigin,
	}
	if c.cl.State.Inflight.Set(pk) {
		atomic.AddInt64(&c.h.srv.Info.Inflight, 1)
	}
}

// dropPlaceholder removes ingest's PUBREC for id, if it is still there.
func (c *ingestConn) dropPlaceholder(id uint16) {
	if holdsPlaceholder(c.cl, id) {
		if c.cl.State.Inflight.Delete(id) {
			atomic.AddInt64(&c.h.srv.Info.Inflight, -1)
		}
	}
}

// dropPendingPlaceholders removes the PUBRECs of QoS 2 publishes not yet
// durable, before a new connection of the same client inherits (and would
// resend) them.
func (c *ingestConn) dropPendingPlaceholders() {
	c.mu.Lock()
	ids := make([]uint16, 0, len(c.mu.qos2))
	for id, e := range c.mu.qos2 {
		if e.placeholder {
			ids = append(ids, id)
			e.placeholder = false
		}
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.dropPlaceholder(id)
	}
}
