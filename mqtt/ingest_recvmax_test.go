package mqtt

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// expectPacket reads the next packet and fails unless it has type typ and
// reason code; it returns the packet.
func expectPacket(tb testing.TB, c *mqtttest.Raw, typ, code byte) packets.Packet {
	tb.Helper()
	pk := c.Read()
	if pk.FixedHeader.Type != typ || pk.ReasonCode != code {
		tb.Fatalf("got packet type %d reason %#x (%q), want type %d reason %#x",
			pk.FixedHeader.Type, pk.ReasonCode, pk.Properties.ReasonString, typ, code)
	}
	return pk
}

func TestIngest_ReceiveMaximum(t *testing.T) {
	const window = 4

	t.Run("MQTT 5 client above it is disconnected with 0x93", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		st.hold() // no append completes, so no PUBACK can free a flow
		m := NewMetrics(nil)
		b := newTestBroker(t, l, func(c *Config) { c.Window = window; c.Metrics = m })
		conn := rawConnect("eager", 5)
		conn.Will = &mqtttest.Will{Topic: "sensors/eager/status", Payload: []byte("gone"), Qos: 1}
		c := mqtttest.Dial(t, b.Addr().String(), conn)
		if got := c.Connack.Properties.ReceiveMaximum; got != window {
			t.Fatalf("CONNACK Receive Maximum = %d, want %d", got, window)
		}
		for i := 1; i <= window+1; i++ {
			c.Publish("sensors/x", 1, uint16(i), "x")
		}
		expectPacket(t, c, packets.Disconnect, packets.ErrReceiveMaximum.Code)
		expectClosed(t, c)
		if got := metricValue(m.Closed.WithLabelValues(ReasonReceiveMaximum)); got != 1 {
			t.Fatalf("closed{receive_maximum} = %v, want 1", got)
		}
		st.release()
		// The publishes within the maximum, then the will: a protocol
		// error is an abnormal end.
		recs := st.waitRecords(t, window+1)
		if len(recs) != window+1 || recs[window].Topic != "sensors/eager/status" {
			t.Fatalf("log = %d records, want %d publishes and the will", len(recs), window)
		}
	})

	t.Run("the will is sent when mochi handed the publish over (topic alias)", func(t *testing.T) {
		// Aliased publishes reach ingest through mochi's processPublish and
		// OnPublish, after which mochi's read loop ends without an error.
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		st.hold()
		b := newTestBroker(t, l, func(c *Config) { c.Window = 2 })
		conn := rawConnect("aliased", 5)
		conn.Will = &mqtttest.Will{Topic: "sensors/aliased/status", Payload: []byte("gone"), Qos: 1}
		c := mqtttest.Dial(t, b.Addr().String(), conn)
		alias := packets.Properties{TopicAlias: 1, TopicAliasFlag: true}
		c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
			TopicName: "sensors/aliased/t", PacketID: 1, Payload: []byte("1"), Properties: alias})
		for id := uint16(2); id <= 3; id++ {
			c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
				PacketID: id, Payload: []byte("n"), Properties: alias})
		}
		expectPacket(t, c, packets.Disconnect, packets.ErrReceiveMaximum.Code)
		expectClosed(t, c)
		st.release()
		recs := st.waitRecords(t, 3)
		if len(recs) != 3 || recs[2].Topic != "sensors/aliased/status" {
			t.Fatalf("log = %d records, want 2 publishes and the will", len(recs))
		}
	})

	t.Run("MQTT 5 client within it is served", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		st.hold()
		b := newTestBroker(t, l, func(c *Config) { c.Window = window })
		c := dialRaw(t, b, "polite", 5)
		id := uint16(0)
		for round := 0; round < 3; round++ {
			for i := 0; i < window; i++ {
				id++
				c.Publish("sensors/x", 1, id, "x")
			}
			st.waitAppends(t, int(id))
			st.release()
			for i := 0; i < window; i++ {
				expectPacket(t, c, packets.Puback, 0)
			}
			st.hold()
		}
		st.release()
	})

	t.Run("QoS 2 flows awaiting PUBREL count", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		b := newTestBroker(t, l, func(c *Config) { c.Window = 2 })
		c := dialRaw(t, b, "exactly-once", 5)
		c.Publish("sensors/x", 2, 1, "a")
		c.Publish("sensors/x", 2, 2, "b")
		expectPacket(t, c, packets.Pubrec, 0)
		expectPacket(t, c, packets.Pubrec, 0)
		// PUBREL for 1 ends that flow: one more may start.
		c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: 1})
		expectPacket(t, c, packets.Pubcomp, 0)
		c.Publish("sensors/x", 2, 3, "c")
		expectPacket(t, c, packets.Pubrec, 0)
		// 2 and 3 still await PUBREL: a fourth flow is one too many.
		c.Publish("sensors/x", 1, 4, "d")
		expectPacket(t, c, packets.Disconnect, packets.ErrReceiveMaximum.Code)
		expectClosed(t, c)
	})

	t.Run("MQTT 3.1.1 client waits for its window instead", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		st.hold()
		b := newTestBroker(t, l, func(c *Config) { c.Window = window })
		c := dialRaw(t, b, "v3", 4)
		for i := 1; i <= window+2; i++ {
			c.Publish("sensors/x", 1, uint16(i), "x")
		}
		st.waitAppends(t, window)
		st.release()
		for i := 1; i <= window+2; i++ {
			if pk := expectPacket(t, c, packets.Puback, 0); pk.PacketID != uint16(i) {
				t.Fatalf("PUBACK %d, want %d", pk.PacketID, i)
			}
		}
	})
}
