package mqtt

import (
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Packet identifiers toward a client.
//
// MQTT keeps the packet ids of the two directions apart ([MQTT-2.2.1-3]):
// the client numbers its QoS 1/2 PUBLISHes, SUBSCRIBEs and UNSUBSCRIBEs, the
// server numbers its QoS 1/2 PUBLISHes, and one id may be in use both ways
// at once. mochi v2.7.9 keeps both in one Inflight map per client, so with
// deliveries in that map a client that reuses one of their ids gets its
// SUBSCRIBE or UNSUBSCRIBE refused (0x91, "packet identifier in use"; what
// mosquitto_sub -c reports as "All subscription requests were denied" after
// a reconnect brings redeliveries), its QoS 1 PUBLISH deletes the delivery's
// entry, and its QoS 2 PUBREC entry is overwritten by, or deleted with, the
// delivery's.
//
// So Peat numbers every packet it sends toward a client itself, from one
// allocator per connection (deliveryClient.allocIDLocked), and keeps its own
// deliveries out of mochi's map:
//
//   - Peat's deliveries take an id from the allocator and are tracked only
//     in deliveryClient.mu.outstanding. The client's PUBACK, PUBREC and
//     PUBCOMP always answer a server PUBLISH: for one of these ids they are
//     taken in OnPacketRead (handleAck) and reach mochi as a no-op. Peat
//     writes the PUBREL of a QoS 2 delivery itself.
//   - mochi's own QoS 1/2 deliveries (topics no stream captures, and
//     their retained messages on subscribe) keep mochi's id in mochi's map, but leave with
//     an id from the same allocator: OnPacketEncode rewrites the PUBLISH and
//     its PUBREL (wireID), and OnPacketRead maps the client's answers back
//     (handleAck), so mochi's and Peat's deliveries never share an id.
//   - The client's ids reach mochi untouched, and mochi's map holds only
//     them and mochi's own deliveries: a SUBSCRIBE, UNSUBSCRIBE or PUBLISH
//     never meets a Peat delivery there, whatever id it carries.
//
// The allocator skips the ids of Peat's outstanding deliveries, of mochi's
// deliveries on the wire, and every id in mochi's map (which covers mochi's
// deliveries sent before the client had delivery state, such as its resends
// at reconnect, whose ids went out unchanged). Known limit: mochi's own
// deliveries still sit in the shared map under mochi's id, so a client that
// reuses that id while one is unacknowledged meets plain mochi's behaviour
// (rare: only uncaptured topics and their retained messages take that
// path).

// outstandingDelivery is a QoS 1/2 delivery awaiting its acknowledgement:
// PUBACK, or PUBCOMP after Peat answered PUBREC with PUBREL.
type outstandingDelivery struct {
	settle func()
}

// allocIDLocked returns a free packet id for a PUBLISH toward the client,
// after the last one handed out; ok is false when every id is taken.
// c.mu must be held.
func (c *deliveryClient) allocIDLocked() (id uint16, ok bool) {
	for range 65535 {
		c.mu.lastID++
		if c.mu.lastID == 0 {
			c.mu.lastID = 1
		}
		id := c.mu.lastID
		if _, mine := c.mu.outstanding[id]; mine {
			continue
		}
		if _, theirs := c.mu.mochiByWire[id]; theirs {
			continue
		}
		if _, inMap := c.cl.State.Inflight.Get(id); inMap {
			continue
		}
		return id, true
	}
	return 0, false
}

// wireID gives a PUBLISH or PUBREL that mochi writes for one of its own
// deliveries the id it carries on the wire (see above).
func (c *deliveryClient) wireID(pk *packets.Packet) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := pk.PacketID
	w, known := c.mu.wireByMochi[m]
	switch {
	case pk.FixedHeader.Type == packets.Pubrel, pk.FixedHeader.Dup:
		// The second step of a QoS 2 delivery, or a resend: the id the
		// PUBLISH went with, unchanged if it went out as mochi's.
		if known {
			pk.PacketID = w
		}
		return
	case known:
		delete(c.mu.mochiByWire, w) // mochi reused its id: the old one is over
	}
	w, ok := c.allocIDLocked()
	if !ok {
		delete(c.mu.wireByMochi, m)
		return // every id taken: mochi's own, as plain mochi would send it
	}
	if c.mu.mochiByWire == nil {
		c.mu.mochiByWire = map[uint16]uint16{}
		c.mu.wireByMochi = map[uint16]uint16{}
	}
	c.mu.mochiByWire[w], c.mu.wireByMochi[m] = m, w
	pk.PacketID = w
}

// handleAck takes the client's PUBACK, PUBREC or PUBCOMP pk. One for a Peat
// delivery is handled here and returns the no-op packet for mochi; one for
// mochi's own delivery returns with mochi's id; anything else is returned
// as it came.
func (c *deliveryClient) handleAck(pk packets.Packet) packets.Packet {
	typ, id := pk.FixedHeader.Type, pk.PacketID
	failed := pk.ReasonCode >= packets.ErrUnspecifiedError.Code
	c.mu.Lock()
	if out, ok := c.mu.outstanding[id]; ok {
		if typ == packets.Pubrec && !failed {
			// Received, not yet complete: release it (again, if the
			// client resends PUBREC) and wait for PUBCOMP.
			c.mu.Unlock()
			c.writePubrel(id)
			return handled
		}
		delete(c.mu.outstanding, id)
		c.mu.Unlock()
		c.retire(out)
		return handled
	}
	if m, ok := c.mu.mochiByWire[id]; ok {
		if typ != packets.Pubrec || failed {
			delete(c.mu.mochiByWire, id)
			delete(c.mu.wireByMochi, m)
		}
		pk.PacketID = m
	}
	c.mu.Unlock()
	return pk
}

// retire ends an outstanding delivery, acknowledged or never written: its
// window slot and packet id are free again, and it is settled.
func (c *deliveryClient) retire(out outstandingDelivery) {
	c.d.addInflight(-1)
	if out.settle != nil {
		out.settle()
	}
	c.wakeSender()
}

// writePubrel sends PUBREL for a QoS 2 delivery whose PUBREC came: the same
// four bytes for MQTT 3.1.1 and 5 (reason Success, no properties). A
// failed write ends the connection, as any other failed write does; the
// delivery is sent again from the log on reconnect.
func (c *deliveryClient) writePubrel(id uint16) {
	var b [4]byte
	if err := writeDirect(c.d.srv, c.cl, appendPubrel(b[:0], id), false); err != nil {
		c.d.logger.Debug("delivery: PUBREL not written", attrClient, c.id, attrErr, err)
	}
}

// mochiWireID is OnPacketEncode's part in the scheme above.
func (d *delivery) mochiWireID(cl *mochi.Client, pk *packets.Packet) {
	switch {
	case pk.FixedHeader.Type == packets.Publish && pk.FixedHeader.Qos > 0, pk.FixedHeader.Type == packets.Pubrel:
		if c := d.client(cl); c != nil {
			c.wireID(pk)
		}
	}
}

// appendPubrel appends a PUBREL of reason Success for id.
func appendPubrel(dst []byte, id uint16) []byte {
	dst = appendAck(dst, packets.Pubrel, id)
	dst[len(dst)-4] |= 0x02 // PUBREL's fixed header flags [MQTT-3.6.1-1]
	return dst
}
