package mqtt

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// readUnacked reads n PUBLISHes without acknowledging them and returns
// them by topic, failing on a packet id used twice.
func readUnacked(tb testing.TB, c *mqtttest.Raw, n int) map[string]packets.Packet {
	tb.Helper()
	byTopic := map[string]packets.Packet{}
	ids := map[uint16]string{}
	for len(byTopic) < n {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			tb.Fatalf("got packet type %d, want PUBLISH", pk.FixedHeader.Type)
		}
		if other, dup := ids[pk.PacketID]; dup {
			tb.Fatalf("packet id %d of %s is still in use by %s", pk.PacketID, pk.TopicName, other)
		}
		ids[pk.PacketID] = pk.TopicName
		byTopic[pk.TopicName] = pk
	}
	return byTopic
}

// A client's SUBSCRIBE, UNSUBSCRIBE and QoS 1/2 PUBLISHes may use the ids
// of deliveries it has not yet acknowledged: MQTT keeps the two directions
// apart. Each gets its normal answer, and nothing is lost or sent twice.
func TestPacketID_ClientIDsDoNotClashWithDeliveries(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l)
			c := dialDurable(t, b, version)
			c.Subscribe("d/#", 1)
			store(t, s, topicsN("d", 0, 6), nil)
			got := readUnacked(t, c, 6)
			ids := make([]uint16, 6)
			for i := range ids {
				ids[i] = got[fmt.Sprintf("d/%d", i)].PacketID
			}

			c.Write(packets.Packet{
				FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
				PacketID:    ids[0],
				Filters:     packets.Subscriptions{{Filter: "e/#", Qos: 1}},
			})
			if ack := c.ReadUntil(packets.Suback); ack.PacketID != ids[0] || len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] > 2 {
				t.Fatalf("SUBSCRIBE with id %d: SUBACK id %d codes %v, want granted", ids[0], ack.PacketID, ack.ReasonCodes)
			}
			c.Write(packets.Packet{
				FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe, Qos: 1},
				PacketID:    ids[1],
				Filters:     packets.Subscriptions{{Filter: "e/#"}},
			})
			ack := c.ReadUntil(packets.Unsuback)
			if ack.PacketID != ids[1] || (version == 5 && (len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != 0)) {
				t.Fatalf("UNSUBSCRIBE with id %d: UNSUBACK id %d codes %v, want success", ids[1], ack.PacketID, ack.ReasonCodes)
			}

			c.Publish("d/q1", 1, ids[2], "one")
			if ack := c.ReadUntil(packets.Puback); ack.PacketID != ids[2] || ack.ReasonCode != 0 {
				t.Fatalf("QoS 1 PUBLISH with id %d: PUBACK id %d reason %#x", ids[2], ack.PacketID, ack.ReasonCode)
			}
			c.Publish("d/q2", 2, ids[3], "two")
			if ack := c.ReadUntil(packets.Pubrec); ack.PacketID != ids[3] || ack.ReasonCode != 0 {
				t.Fatalf("QoS 2 PUBLISH with id %d: PUBREC id %d reason %#x", ids[3], ack.PacketID, ack.ReasonCode)
			}
			c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: ids[3]})
			if ack := c.ReadUntil(packets.Pubcomp); ack.PacketID != ids[3] || ack.ReasonCode != 0 {
				t.Fatalf("PUBREL %d: PUBCOMP id %d reason %#x, want success", ids[3], ack.PacketID, ack.ReasonCode)
			}

			// The two publishes come back as deliveries, under ids of their
			// own; then every delivery is acknowledged.
			for topic, pk := range readUnacked(t, c, 2) {
				got[topic] = pk
			}
			for _, topic := range []string{"d/q1", "d/q2"} {
				if _, ok := got[topic]; !ok {
					t.Fatalf("own publish %s not delivered; got %d deliveries", topic, len(got))
				}
			}
			for _, pk := range got {
				c.Puback(pk.PacketID) // the records are QoS 1, as granted
			}
			acksRead(t, c)

			// Every acknowledgement counted: the session resumes after all
			// eight, with nothing sent again (a resend would come first).
			leave(t, b, c)
			c = dialDurable(t, b, version)
			store(t, s, []string{"d/after"}, nil)
			if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "d/after" {
				t.Fatalf("after reconnect: %q, want d/after", pk.TopicName)
			}
		})
	}
}

// A QoS 2 delivery goes PUBLISH, PUBREC, PUBREL, PUBCOMP, with Peat
// writing the PUBREL, and leaves the window only on PUBCOMP.
func TestPacketID_QoS2DeliveryIsReleasedByPeat(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	sub := dialDlvRaw(t, b.Addr().String(), "sub", 5, packets.Properties{ReceiveMaximum: 1})
	sub.Subscribe("d/#", 2)
	pub := dialRaw(t, b, "pub", 5)
	pub.Publish("d/0", 2, 7, "x")
	pub.ReadUntil(packets.Pubrec)
	pub.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: 7})
	pub.ReadUntil(packets.Pubcomp)
	pub.Publish("d/1", 1, 8, "y")
	pub.ReadUntil(packets.Puback)

	pk := sub.Read()
	if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Qos != 2 || pk.TopicName != "d/0" {
		t.Fatalf("got type %d qos %d topic %q, want a QoS 2 PUBLISH of d/0", pk.FixedHeader.Type, pk.FixedHeader.Qos, pk.TopicName)
	}
	sub.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID})
	if rel := sub.Read(); rel.FixedHeader.Type != packets.Pubrel || rel.PacketID != pk.PacketID || rel.ReasonCode != 0 {
		t.Fatalf("after PUBREC: type %d id %d reason %#x, want PUBREL %d", rel.FixedHeader.Type, rel.PacketID, rel.ReasonCode, pk.PacketID)
	}
	// Receive Maximum 1: d/1 waits for the PUBCOMP.
	testwait.Eventually(t, "d/1 to wait for room in the window", func() bool { return parkedIn("(*deliveryClient).waitWindow") })
	sub.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, PacketID: pk.PacketID})
	if pk := readPublishes(t, sub, 1)[0]; pk.TopicName != "d/1" {
		t.Fatalf("after PUBCOMP: %q, want d/1", pk.TopicName)
	}
}

// mochi's own deliveries (a topic no stream captures) and Peat's never
// carry the same packet id while both are unacknowledged, and each
// acknowledgement ends the right one.
func TestPacketID_MochiDeliveriesDoNotShareIDsWithPeat(t *testing.T) {
	l := newMemLog(t, "default=d/#") // u/# is mochi's
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	sub := dialDlvRaw(t, b.Addr().String(), "sub", 5, packets.Properties{})
	sub.Subscribe("d/#", 1)
	sub.Subscribe("u/#", 1)
	pub := dialRaw(t, b, "pub", 5)

	seen := map[uint16]string{}
	var order []packets.Packet
	for i := range 3 {
		store(t, s, []string{fmt.Sprintf("d/%d", i)}, nil)
		pub.Publish(fmt.Sprintf("u/%d", i), 1, uint16(i+1), "m")
		pub.ReadUntil(packets.Puback)
		for _, pk := range readUnacked(t, sub, 2) {
			if other, dup := seen[pk.PacketID]; dup {
				t.Fatalf("id %d of %s is still in use by %s", pk.PacketID, pk.TopicName, other)
			}
			seen[pk.PacketID] = pk.TopicName
			order = append(order, pk)
		}
	}
	for _, pk := range order {
		sub.Puback(pk.PacketID)
	}
	acksRead(t, sub)
	cl, ok := b.srv.Clients.Get("sub")
	if !ok {
		t.Fatal("subscriber gone")
	}
	testwait.Eventually(t, "mochi's deliveries to be acknowledged", func() bool { return cl.State.Inflight.Len() == 0 })
	c := b.deliv.client(cl)
	testwait.Eventually(t, "Peat's deliveries to be acknowledged", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.mu.outstanding) == 0 && len(c.mu.mochiByWire) == 0
	})
}

// The PUBREL Peat writes is the one mochi would write (reason Success).
func TestWritePubrel_SameBytesAsMochi(t *testing.T) {
	for _, version := range []byte{4, 5} {
		for _, id := range []uint16{1, 0x1234, 65535} {
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel, Qos: 1}, PacketID: id, ProtocolVersion: version}
			var want bytes.Buffer
			if err := pk.PubrelEncode(&want); err != nil {
				t.Fatal(err)
			}
			if got := appendPubrel(nil, id); !bytes.Equal(got, want.Bytes()) {
				t.Errorf("v%d id %d: got % x, want % x", version, id, got, want.Bytes())
			}
		}
	}
}
