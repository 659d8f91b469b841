package mqtt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// deliveryItem is one record on its way to one client.
type deliveryItem struct {
	rec    *logstore.Record // shared, never modified
	r      *deliveryReader  // the stream it came from; nil for $offsets
	qos    byte             // granted: min(subscription, record, server)
	retain bool
	subIDs []int // v5 subscription identifiers
	// ext, when set, is the extension subscription ($replay, $group) the
	// record is delivered for: it changes the topic and adds properties
	// (publishExtras).
	ext *extFilter
	// client: the extension delivery shows rec.ClientID (tap.clients).
	client bool
	// settle, when set, is called once the consumer is through with the
	// delivery: acknowledged (PUBACK, PUBCOMP), written (QoS 0), or skipped
	// (expired, too large for the client). It moves the consumer's progress.
	settle func()
	// rs marks a durable session's resends (resend.go); nil for others.
	rs *resends
}

// item builds what c is sent for rec of stream r under sub, or reports
// false when c must not get it (NoLocal, or its ACL). filter is the
// subscription's filter over the original topics: sub.Filter, or the one
// inside a $replay or $group subscription. Every delivery from the log
// passes here (shared reader, lagging cursors, $share groups, taps,
// resumed sessions), so this is where read ACLs bind each record.
func (c *deliveryClient) item(r *deliveryReader, sub packets.Subscription, filter string, rec *logstore.Record) (deliveryItem, bool) {
	if sub.NoLocal && rec.ClientID == c.id {
		return deliveryItem{}, false // [MQTT-3.8.3-3]
	}
	if c.read != nil && !c.read(filter, rec.Topic) {
		c.d.dropDenied.Inc()
		return deliveryItem{}, false
	}
	it := deliveryItem{
		rec: rec,
		r:   r,
		qos: min(rec.QoS, sub.Qos, c.d.maxQoS()),
		// [MQTT-3.3.1-12]: cleared unless a v5 subscription asked to keep it.
		retain: rec.Retain && c.v5 && sub.RetainAsPublished,
	}
	if c.v5 {
		it.subIDs = deliverySubIDs(sub)
	}
	return it, true
}

// deliveryClient is the delivery state of one connected client: a bounded
// queue that readers and cursors fill, and one sender goroutine that writes
// it to the client, keeping at most window QoS 1/2 messages unacknowledged.
type deliveryClient struct {
	d      *delivery
	cl     *mochi.Client
	id     string
	v5     bool
	window int
	// read checks each record against the client's ACL; nil: no checks.
	read readCheck
	// durable: the client holds a stored session (persistent, or resumed
	// for this connection only), resumed from the log.
	durable bool

	queue   chan deliveryItem
	freed   chan struct{} // 1-buffered: an outstanding delivery ended (wakeSender)
	ctx     context.Context
	cancel  context.CancelFunc
	writing atomic.Bool            // the sender is inside a socket write
	gated   atomic.Bool            // mu.gates is not empty
	wbuf    []byte                 // the sender's encoding buffer (wire.go)
	ubuf    []packets.UserProperty // the sender's scratch for packet
	aliases *topicAliases          // the sender's topic aliases (topicalias.go); nil for none

	mu struct {
		sync.Mutex
		// outstanding holds the QoS 1/2 deliveries awaiting PUBACK or
		// PUBCOMP, by packet id. They are not in mochi's Inflight map,
		// which holds the client's own ids too (packetid.go).
		outstanding map[uint16]outstandingDelivery
		// lastID is the packet id last handed out toward the client.
		lastID uint16
		// mochiByWire and wireByMochi map the ids mochi's own deliveries
		// carry on the wire to mochi's ids and back (packetid.go).
		mochiByWire, wireByMochi map[uint16]uint16
		// taps are the client's extension subscriptions, by filter.
		taps map[string]*tap
		// subacks are the plans of SUBSCRIBEs with extension filters whose
		// SUBACK is not yet sent, by packet id.
		subacks map[uint16]*subackPlan
		// wants are the filters of SUBSCRIBEs being processed that get
		// retained messages, by packet id; gates hold back the records of
		// new ones, by filter (delivery_retained.go).
		wants map[uint16][]retainedWant
		gates map[string]*retainedGate
	}
}

func newDeliveryClient(d *delivery, cl *mochi.Client) *deliveryClient {
	c := &deliveryClient{
		d:       d,
		cl:      cl,
		id:      cl.ID,
		v5:      cl.Properties.ProtocolVersion == 5,
		durable: d.sessions.held(cl),
		read:    d.readCheckOf(cl),
		window:  d.cfg.SendWindow,
		queue:   make(chan deliveryItem, d.cfg.QueueDepth),
		freed:   make(chan struct{}, 1),
	}
	if rm := int(cl.Properties.Props.ReceiveMaximum); c.v5 && rm > 0 && rm < c.window {
		c.window = rm
	}
	if c.v5 {
		c.aliases = newTopicAliases(min(int(cl.Properties.Props.TopicAliasMaximum), d.cfg.TopicAliases))
	}
	c.ctx, c.cancel = context.WithCancel(d.ctx)
	c.mu.outstanding = map[uint16]outstandingDelivery{}
	return c
}

// stop ends delivery to the client; its sender and cursors exit.
func (c *deliveryClient) stop() { c.cancel() }

// offer queues it without blocking; false when the queue is full or the
// client is gone.
func (c *deliveryClient) offer(it deliveryItem) bool {
	if c.ctx.Err() != nil {
		return false
	}
	select {
	case c.queue <- it:
		return true
	default:
		return false
	}
}

// push queues it, waiting for room; it fails when ctx ends (the client's
// or a tap's: the client, or the subscription, is gone).
func (c *deliveryClient) push(ctx context.Context, it deliveryItem) error {
	select {
	case c.queue <- it:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run is the sender loop.
func (c *deliveryClient) run() {
	defer c.d.wg.Done()
	defer c.d.panics.catch(c.cl, "delivery")
	for {
		select {
		case <-c.ctx.Done():
			return
		case it := <-c.queue:
			if err := c.sendBurst(it); err != nil {
				if c.ctx.Err() == nil {
					c.d.logger.Debug("delivery: stopped sending to client", attrClient, c.id, attrErr, err)
				}
				c.cancel()
				return
			}
		}
	}
}

// maxBurst bounds how many deliveries one corked burst writes.
const maxBurst = 256

// sendBurst writes it and then whatever else is already queued, with the
// connection corked so the packets leave in as few socket writes as
// possible (each packet is otherwise its own syscall). It uncorks before waiting for room in the window: the client
// cannot acknowledge what it has not received.
func (c *deliveryClient) sendBurst(it deliveryItem) (err error) {
	cc, _ := c.cl.Net.Conn.(*corkConn)
	corked := false
	defer func() {
		if corked {
			if ferr := c.uncork(cc); err == nil && ferr != nil {
				err = fmt.Errorf("write to %s: %w", c.id, ferr)
			}
		}
	}()
	for n := 1; ; n++ {
		if cc != nil {
			full := it.qos > 0 && !c.windowHasRoom()
			switch {
			case full && corked:
				corked = false
				if err := c.uncork(cc); err != nil {
					return fmt.Errorf("write to %s: %w", c.id, err)
				}
			case !full && !corked:
				cc.cork()
				corked = true
			}
		}
		if err := c.send(it); err != nil {
			return err
		}
		if n == maxBurst {
			return nil
		}
		select {
		case it = <-c.queue:
		default:
			return nil
		}
	}
}

// uncork sends what the burst held back, marked as writing so Close can
// unblock it.
func (c *deliveryClient) uncork(cc *corkConn) error {
	c.writing.Store(true) // before the check, as in send
	if c.ctx.Err() != nil {
		_ = cc.SetWriteDeadline(time.Now()) // stopping: do not wait on a client that does not read
	}
	err := cc.uncork()
	c.writing.Store(false)
	return err
}

// windowHasRoom reports whether one more QoS 1/2 delivery fits the window.
func (c *deliveryClient) windowHasRoom() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mu.outstanding) < c.window
}

// send writes one delivery, first waiting for room in the window when it
// needs an acknowledgement, and writes it synchronously (never through
// mochi's outbound channel, which drops when full), under a packet id of
// Peat's own (packetid.go). A record whose message expiry has passed by
// then is skipped (expiry.go).
func (c *deliveryClient) send(it deliveryItem) error {
	if it.qos > 0 {
		if err := c.waitWindow(); err != nil {
			return err
		}
	}
	left, expiredAt, skip := expiryOf(&it)
	if skip {
		c.d.dropExpired.Inc()
		if it.settle != nil {
			it.settle() // nothing to acknowledge: the consumer's progress moves past it
		}
		return nil
	}
	out := c.packet(it, left, expiredAt)
	var x *publishExtras
	if it.ext != nil {
		x = &publishExtras{head: it.ext.head, offset: it.rec.Offset, timestamp: it.rec.Timestamp}
		if it.client {
			x.client = it.rec.ClientID
		}
		if it.r != nil {
			x.stream = it.r.stream.Name()
		}
	}
	if it.qos > 0 {
		id, err := c.register(it.settle)
		if err != nil {
			return err
		}
		out.PacketID = id
		out.FixedHeader.Dup = it.rs.dup(it.rec.Offset) // [MQTT-3.3.1-1] [MQTT-3.3.1-3]
	}
	topic, binds := out.TopicName, false
	if x == nil {
		binds = c.aliases.apply(&out)
	}

	c.writing.Store(true) // before the check: Close sees either the flag or a cancelled ctx
	if err := c.ctx.Err(); err != nil {
		c.writing.Store(false)
		return err
	}
	err := c.writePublish(&out, x)
	c.writing.Store(false)
	if errors.Is(err, packets.ErrPacketTooLarge) {
		// Larger than the client's Maximum Packet Size: it can never take it.
		if it.qos > 0 {
			c.unregister(out.PacketID)
		}
		if binds {
			c.aliases.forget(topic) // the client never learnt it
		}
		c.d.dropTooLarge.Inc()
		c.d.logger.Warn("delivery: record larger than the client's maximum packet size; skipped",
			attrClient, c.id, attrTopic, it.rec.Topic, attrOffset, it.rec.Offset)
		if it.qos == 0 && it.settle != nil {
			it.settle()
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("write %s offset %d to %s: %w", it.rec.Topic, it.rec.Offset, c.id, err)
	}
	if it.r != nil {
		it.r.delivered.Inc()
	}
	if it.qos > 0 {
		it.rs.wrote(it.rec.Offset)
	}
	if it.qos == 0 && it.settle != nil {
		it.settle()
	}
	return nil
}

// maxKeptWriteBuf bounds the encoding buffer a sender keeps between
// packets; a larger record's buffer is let go after it is written.
const maxKeptWriteBuf = 64 << 10

// writePublish encodes pk with the extras x (wire.go) and writes it to the client's
// connection, as mochi's WritePacket would, at a fraction of its cost. Each
// packet is one Write, so it never interleaves with packets mochi writes.
// User properties that would take pk over the client's Maximum Packet Size
// are left out, as mochi does; a packet that is too large without them
// fails with packets.ErrPacketTooLarge.
func (c *deliveryClient) writePublish(pk *packets.Packet, x *publishExtras) error {
	maxSize := int64(c.cl.Properties.Props.MaximumPacketSize)
	c.wbuf = appendPublish(c.wbuf[:0], pk, x, c.v5, true)
	if maxSize > 0 && int64(len(c.wbuf)) > maxSize && c.v5 && (len(pk.Properties.User) > 0 || x != nil) {
		c.wbuf = appendPublish(c.wbuf[:0], pk, x, c.v5, false)
	}
	if maxSize > 0 && int64(len(c.wbuf)) > maxSize {
		return packets.ErrPacketTooLarge // [MQTT-3.1.2-24]
	}
	err := writeDirect(c.d.srv, c.cl, c.wbuf, true)
	if cap(c.wbuf) > maxKeptWriteBuf {
		c.wbuf = nil
	}
	return err
}

// packet builds the PUBLISH for it, without its extension subscription's
// extras, with the Message Expiry Interval left (0: none) and, for an
// expired record a $replay shows, the time expiredAt it expired (0: not
// expired). Its user properties are the sender's scratch slice, valid
// until the next call.
func (c *deliveryClient) packet(it deliveryItem, left uint32, expiredAt int64) packets.Packet {
	rec := it.rec
	out := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: it.qos, Retain: it.retain},
		TopicName:   rec.Topic,
		Payload:     rec.Payload,
		Origin:      rec.ClientID,
	}
	if !c.v5 {
		return out
	}
	p := &out.Properties
	p.ContentType = rec.ContentType
	p.ResponseTopic = rec.ResponseTopic
	p.CorrelationData = rec.CorrelationData
	if rec.PayloadFormat != nil {
		p.PayloadFormat, p.PayloadFormatFlag = *rec.PayloadFormat, true
	}
	p.MessageExpiryInterval = left
	if len(rec.UserProperties) > 0 || expiredAt != 0 {
		c.ubuf = c.ubuf[:0]
		for _, u := range rec.UserProperties {
			c.ubuf = append(c.ubuf, packets.UserProperty{Key: u.Key, Val: u.Value})
		}
		if expiredAt != 0 {
			c.appendExpiredProp(expiredAt)
		}
		p.User = c.ubuf
	}
	p.SubscriptionIdentifier = it.subIDs
	return out
}

// waitWindow waits until fewer than window deliveries are unacknowledged.
func (c *deliveryClient) waitWindow() error {
	for {
		c.mu.Lock()
		n := len(c.mu.outstanding)
		c.mu.Unlock()
		if n < c.window {
			return nil
		}
		select {
		case <-c.freed:
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
}

// register records a QoS 1/2 delivery as outstanding under a free packet
// id (packetid.go) and returns the id, waiting for an acknowledgement when
// every id is taken.
func (c *deliveryClient) register(settle func()) (uint16, error) {
	for {
		c.mu.Lock()
		if err := c.ctx.Err(); err != nil {
			c.mu.Unlock() // stopped: dropOutstanding may have run already
			return 0, err
		}
		id, ok := c.allocIDLocked()
		if ok {
			c.mu.outstanding[id] = outstandingDelivery{settle: settle}
			c.mu.Unlock()
			c.d.addInflight(1)
			return id, nil
		}
		c.mu.Unlock()
		select {
		case <-c.freed:
		case <-c.ctx.Done():
			return 0, fmt.Errorf("packet id for %s: %w", c.id, packets.ErrQuotaExceeded)
		}
	}
}

// unregister ends an outstanding delivery that was never written.
func (c *deliveryClient) unregister(id uint16) {
	c.mu.Lock()
	out, ok := c.mu.outstanding[id]
	delete(c.mu.outstanding, id)
	c.mu.Unlock()
	if ok {
		c.retire(out)
	}
}

// wakeSender wakes a sender waiting for a window slot or a packet id.
func (c *deliveryClient) wakeSender() {
	select {
	case c.freed <- struct{}{}:
	default:
	}
}

// installTap makes t the client's tap for its filter, stopping the one it
// replaces (a SUBSCRIBE to the same filter replaces the subscription).
func (c *deliveryClient) installTap(t *tap) {
	c.mu.Lock()
	old := c.mu.taps[t.filter]
	if c.mu.taps == nil {
		c.mu.taps = map[string]*tap{}
	}
	c.mu.taps[t.filter] = t
	c.mu.Unlock()
	if old != nil && old != t {
		old.stop()
	}
}

// removeTap stops the tap of filter, if any.
func (c *deliveryClient) removeTap(filter string) {
	c.mu.Lock()
	t := c.mu.taps[filter]
	delete(c.mu.taps, filter)
	c.mu.Unlock()
	if t != nil {
		t.stop()
	}
}

// dropOutstanding forgets the client's unacknowledged deliveries, after
// stop: a new connection that inherits the session gets them again from the
// log (durable sessions resume from the first unacknowledged offset). They
// were never in mochi's inflight map, so mochi does not resend them.
func (c *deliveryClient) dropOutstanding() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.d.addInflight(-int64(len(c.mu.outstanding)))
	c.mu.outstanding = map[uint16]outstandingDelivery{}
}

// countUnsent counts what was still queued when the client went away.
func (c *deliveryClient) countUnsent() {
	if n := len(c.queue); n > 0 {
		c.d.dropClosed.Add(float64(n))
	}
}

// unblockWrite makes a write stuck on a client that does not read fail at
// once. Only Close uses it.
func (c *deliveryClient) unblockWrite() {
	if c.writing.Load() && c.cl.Net.Conn != nil {
		_ = c.cl.Net.Conn.SetWriteDeadline(time.Now())
	}
}
