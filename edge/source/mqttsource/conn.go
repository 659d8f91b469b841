package mqttsource

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// subscribeID is the packet id of the one SUBSCRIBE a connection sends
// (no PUBLISH goes upstream, so no other id is in use).
const subscribeID = 1

// conn is one connection. The reader goroutine turns PUBLISHes into
// messages for Next and PUBRELs into work for the releaser; Done writes
// PUBACK and PUBREC; the releaser makes each release durable (the mark)
// before its PUBCOMP; the pinger keeps the keepalive.
type conn struct {
	u         *Upstream
	nc        net.Conn
	br        *bufio.Reader
	keepalive time.Duration
	in        chan source.Message
	// window holds a token for each message Next handed out and Done
	// has not acknowledged: at most ReceiveMaximum, whatever the upstream
	// sends (a broker may overrun it after a session resumes). Beyond it
	// the reader stops reading, and TCP holds the upstream back: so at
	// most the window of stored messages awaits its acknowledgement when
	// the node dies.
	window chan struct{}
	r      source.Resume
	qos2   bool // a subscription asks for QoS 2

	*mqttclient.Link // writes, and how the connection ends

	mu struct {
		sync.Mutex
		lastRead time.Time
		// open maps the packet id of each QoS 2 message stored here and
		// not yet released (PUBREL) to its record's offset: a PUBLISH
		// with that id is a redelivery until its PUBREL.
		open map[uint16]uint64
		mark uint64   // every record of the source below it is released
		rel  []uint16 // PUBRELs read, for the releaser
	}
	relWake chan struct{} // cap 1

}

var _ source.Conn = (*conn)(nil)

func newConn(u *Upstream, nc net.Conn, br *bufio.Reader, keepalive time.Duration) *conn {
	c := &conn{
		u: u, nc: nc, br: br, keepalive: keepalive,
		in:      make(chan source.Message, u.cfg.ReceiveMaximum),
		window:  make(chan struct{}, u.cfg.ReceiveMaximum),
		Link:    mqttclient.NewLink(nc, keepalive),
		relWake: make(chan struct{}, 1),
	}
	for _, s := range u.cfg.Subscribe {
		c.qos2 = c.qos2 || s.QoS == 2
	}
	c.mu.open = map[uint16]uint64{}
	return c
}

// resume reads which QoS 2 messages the log holds unreleased: those of
// the source's records above the mark that carry a packet id. An
// upstream with no session for the client id (or a source that never
// set its mark) starts with none, and the mark moves to the stream's end.
func (c *conn) resume(ctx context.Context, r source.Resume, sessionPresent bool) error {
	c.r = r
	if !c.qos2 {
		return nil
	}
	mark, ok, err := r.Mark()
	if err != nil {
		return fmt.Errorf("load the source's mark: %w", err)
	}
	if !ok || !sessionPresent {
		end := r.End()
		if err := r.SetMark(end); err != nil {
			return fmt.Errorf("set the source's mark: %w", err)
		}
		c.mu.mark = end
		return nil
	}
	c.mu.mark = mark
	return r.Scan(ctx, mark, func(rec *logstore.Record) bool {
		if rec.QoS != 2 {
			return true
		}
		pid, err := strconv.ParseUint(propOf(rec, PropPID), 10, 16)
		if err != nil || pid == 0 {
			return true
		}
		if _, newer := c.mu.open[uint16(pid)]; !newer {
			c.mu.open[uint16(pid)] = rec.Offset
		}
		return true
	})
}

func propOf(rec *logstore.Record, key string) string {
	for _, p := range rec.UserProperties {
		if p.Key == key {
			return p.Value
		}
	}
	return ""
}

func (c *conn) start() {
	c.mu.lastRead = time.Now()
	c.WG.Add(3)
	go c.readLoop()
	go c.pingLoop()
	go c.releaseLoop()
}

// subscribe sends the SUBSCRIBE; the reader checks its SUBACK. MQTT 5
// options: No Local (the source never publishes on this connection: it
// costs nothing; the records' origin is what keeps a sink from echoing
// them back), Retain As Published (a retained message stays retained
// here), Retain Handling 1 (retained messages only for a new
// subscription).
func (c *conn) subscribe() error {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		ProtocolVersion: c.u.cfg.Version,
		PacketID:        subscribeID,
	}
	for _, s := range c.u.cfg.Subscribe {
		pk.Filters = append(pk.Filters, packets.Subscription{
			Filter: s.Filter, Qos: s.QoS, NoLocal: true, RetainAsPublished: true, RetainHandling: 1,
		})
	}
	var buf bytes.Buffer
	if err := pk.SubscribeEncode(&buf); err != nil {
		return mqttclient.WithReason("protocol", fmt.Errorf("encode SUBSCRIBE: %w", err))
	}
	return c.Write(buf.Bytes())
}

// Next returns the messages read so far (at least one, at most
// maxBatch and what the window has room for), in the upstream's order.
func (c *conn) Next(ctx context.Context) ([]source.Message, error) {
	select { // room for one
	case c.window <- struct{}{}:
	case <-c.Ended():
		return nil, c.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var msgs []source.Message
	select {
	case m := <-c.in:
		msgs = append(msgs, m)
	case <-c.Ended():
		<-c.window
		return nil, c.Err()
	case <-ctx.Done():
		<-c.window
		return nil, ctx.Err()
	}
	for len(msgs) < maxBatch {
		select {
		case c.window <- struct{}{}:
		default:
			return msgs, nil
		}
		select {
		case m := <-c.in:
			msgs = append(msgs, m)
		default:
			<-c.window
			return msgs, nil
		}
	}
	return msgs, nil
}

// token packs a message's QoS and packet id into Message.Ack.
func token(qos byte, pid uint16) uint64 { return uint64(qos)<<16 | uint64(pid) }

func untoken(t uint64) (qos byte, pid uint16) { return byte(t >> 16), uint16(t) }

// Done acknowledges msgs, now durable here, in their order: PUBACK for
// QoS 1, PUBREC for QoS 2 (whose packet id stays open until its PUBREL).
func (c *conn) Done(msgs []source.Message) error {
	var buf []byte
	c.mu.Lock()
	for _, m := range msgs {
		qos, pid := untoken(m.Ack)
		switch qos {
		case 1:
			buf = append(buf, mqttclient.Ack(packets.Puback, pid)...)
		case 2:
			if m.Record != nil {
				c.mu.open[pid] = m.Record.Offset
			}
			buf = append(buf, mqttclient.Ack(packets.Pubrec, pid)...)
		}
	}
	c.mu.Unlock()
	for range msgs {
		<-c.window
	}
	if len(buf) == 0 {
		return nil
	}
	return c.Write(buf)
}

// readLoop reads the upstream's packets until the connection fails.
func (c *conn) readLoop() {
	defer c.WG.Done()
	for {
		pk, err := mqttclient.ReadPacket(c.br, c.u.cfg.Version, nil, c.u.cfg.MaxPacket)
		if err != nil {
			c.Fail(err)
			return
		}
		c.mu.Lock()
		c.mu.lastRead = time.Now()
		c.mu.Unlock()
		switch pk.FixedHeader.Type {
		case packets.Publish:
			if err := c.publish(pk); err != nil {
				c.Fail(err)
				return
			}
		case packets.Pubrel:
			c.mu.Lock()
			c.mu.rel = append(c.mu.rel, pk.PacketID)
			c.mu.Unlock()
			select {
			case c.relWake <- struct{}{}:
			default:
			}
		case packets.Suback:
			if err := checkSuback(pk, c.u.cfg.Subscribe); err != nil {
				c.Fail(err)
				return
			}
		case packets.Pingresp:
		case packets.Disconnect:
			c.Fail(mqttclient.Errorf("refused", "upstream disconnected: reason %#x %s",
				pk.ReasonCode, pk.Properties.ReasonString))
			return
		default:
			c.Fail(mqttclient.Errorf("protocol", "unexpected packet type %d from upstream", pk.FixedHeader.Type))
			return
		}
	}
}

// checkSuback fails on a refused filter: a source that silently lacks a
// subscription would look healthy and bring nothing.
func checkSuback(pk packets.Packet, subs []Subscription) error {
	if pk.PacketID != subscribeID {
		return nil
	}
	for i, code := range pk.ReasonCodes {
		if code >= 0x80 && i < len(subs) {
			return mqttclient.Errorf("refused", "upstream refused the subscription to %q: SUBACK reason %#x %s",
				subs[i].Filter, code, pk.Properties.ReasonString)
		}
	}
	return nil
}

// publish turns a PUBLISH into a message: a QoS 2 redelivery of a
// message stored here into one with no record (only acknowledged again).
func (c *conn) publish(pk packets.Packet) error {
	qos, pid := pk.FixedHeader.Qos, pk.PacketID
	if qos > 0 && pid == 0 {
		return mqttclient.Errorf("protocol", "a QoS %d PUBLISH with packet id 0", qos)
	}
	m := source.Message{Ack: token(qos, pid)}
	dup := false
	if qos == 2 {
		c.mu.Lock()
		_, dup = c.mu.open[pid]
		c.mu.Unlock()
	}
	switch {
	case c.echo(pk):
		m.Drop = "echo"
	case !dup:
		m.Record = c.record(pk)
	}
	select {
	case c.in <- m:
	case <-c.Ended():
	}
	return nil
}

// echo reports whether pk is a message this node's own sink sent up.
func (c *conn) echo(pk packets.Packet) bool {
	if len(c.u.cfg.Echo) == 0 {
		return false
	}
	for _, up := range pk.Properties.User {
		if up.Key == source.PropSink && slices.Contains(c.u.cfg.Echo, up.Val) {
			return true
		}
	}
	return false
}

// record is the local record of a PUBLISH: its topic mapped (empty when
// it maps to none: the framework drops it), its flags, MQTT 5
// properties, and, for QoS 1 and 2, its packet id.
func (c *conn) record(pk packets.Packet) *logstore.Record {
	r := &logstore.Record{
		Topic:    Map(c.u.cfg.Strip, c.u.cfg.Topic, pk.TopicName),
		Payload:  pk.Payload,
		QoS:      pk.FixedHeader.Qos,
		Retain:   pk.FixedHeader.Retain,
		ClientID: c.u.cfg.ClientID,
	}
	if c.u.cfg.Version == 5 {
		p := pk.Properties
		r.ContentType, r.ResponseTopic = p.ContentType, p.ResponseTopic
		r.CorrelationData = p.CorrelationData
		r.MessageExpiry = p.MessageExpiryInterval
		if p.PayloadFormatFlag {
			f := p.PayloadFormat
			r.PayloadFormat = &f
		}
		for _, up := range p.User {
			r.UserProperties = append(r.UserProperties, logstore.UserProperty{Key: up.Key, Value: up.Val})
		}
	}
	if r.QoS > 0 {
		r.UserProperties = append(r.UserProperties, logstore.UserProperty{Key: PropPID, Value: strconv.Itoa(int(pk.PacketID))})
	}
	return r
}

// releaseLoop answers PUBRELs: it moves the mark past the released
// records (durably, one write for every PUBREL waiting) and then sends
// their PUBCOMPs. The upstream may reuse a packet id once it has the
// PUBCOMP; from then on a PUBLISH with that id is a new message, which
// the mark says after a crash too. PUBRELs come in the order of the
// PUBRECs (MQTT 4.6), which is the order of the records, so a release
// releases every record before it.
func (c *conn) releaseLoop() {
	defer c.WG.Done()
	for {
		select {
		case <-c.Ended():
			return
		case <-c.relWake:
		}
		c.mu.Lock()
		pids := c.mu.rel
		c.mu.rel = nil
		mark := c.mu.mark
		for _, pid := range pids {
			if off, ok := c.mu.open[pid]; ok {
				mark = max(mark, off+1)
			}
		}
		moved := mark > c.mu.mark
		c.mu.Unlock()
		if moved {
			if err := c.r.SetMark(mark); err != nil {
				c.Fail(mqttclient.WithReason("append", fmt.Errorf("set the source's mark: %w", err)))
				return
			}
			c.mu.Lock()
			c.mu.mark = mark
			for pid, off := range c.mu.open {
				if off < mark {
					delete(c.mu.open, pid)
				}
			}
			c.mu.Unlock()
		}
		var buf []byte
		for _, pid := range pids {
			buf = append(buf, mqttclient.Ack(packets.Pubcomp, pid)...)
		}
		if c.Write(buf) != nil {
			return
		}
	}
}

// pingLoop sends a PINGREQ every half keepalive and fails the connection
// when nothing was read for a whole keepalive.
func (c *conn) pingLoop() {
	defer c.WG.Done()
	t := time.NewTicker(c.keepalive / 2)
	defer t.Stop()
	ping := []byte{packets.Pingreq << 4, 0}
	for {
		select {
		case <-c.Ended():
			return
		case <-t.C:
		}
		c.mu.Lock()
		quiet := time.Since(c.mu.lastRead)
		c.mu.Unlock()
		if quiet > c.keepalive {
			c.Fail(mqttclient.Errorf("timeout", "nothing from upstream for %v (keepalive)", quiet.Round(time.Millisecond)))
			return
		}
		if c.Write(ping) != nil {
			return
		}
	}
}
