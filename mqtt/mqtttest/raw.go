package mqtttest

import (
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
)

// ReadTimeout bounds every read. It only keeps a broken test from hanging:
// a test that expects the broker to close the connection fails after it.
const ReadTimeout = 30 * time.Second

// Connect is what Dial sends in its CONNECT packet.
type Connect = rawmqtt.Connect

// Will is a last will message.
type Will = rawmqtt.Will

// Raw is a connected client that reads and writes only when told to. Next
// and Send return errors and may be called from a goroutine other than the
// test's; the other methods fail the test through tb. Calls must not
// overlap, except one reader with one writer.
type Raw struct {
	tb      testing.TB
	c       *rawmqtt.Conn
	pending []packets.Packet // read by ReadUntil while waiting for something else
	ctrlID  uint16           // SUBSCRIBE and UNSUBSCRIBE packet ids used

	// Connack is the broker's CONNACK (SessionPresent, properties).
	Connack packets.Packet
}

// Dial connects to addr, sends c's CONNECT and fails the test unless the
// broker answers with a successful CONNACK. The connection is closed at
// cleanup.
func Dial(tb testing.TB, addr string, c Connect) *Raw {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("mqtttest: dial %s: %v", addr, err)
	}
	r := Handshake(tb, conn, c)
	if ack := r.Connack; ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		tb.Fatalf("mqtttest: connect %s: got packet type %d reason %#x, want a successful CONNACK",
			c.ClientID, ack.FixedHeader.Type, ack.ReasonCode)
	}
	return r
}

// Handshake sends c's CONNECT on conn (a TLS connection, say) and reads
// the broker's answer into Connack, successful or not. conn is closed at
// cleanup.
func Handshake(tb testing.TB, conn net.Conn, c Connect) *Raw {
	tb.Helper()
	if c.Version != 4 && c.Version != 5 {
		tb.Fatalf("mqtttest: protocol version %d, want 4 or 5", c.Version)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	r := &Raw{tb: tb, c: rawmqtt.New(conn, 0)}
	_ = conn.SetReadDeadline(time.Now().Add(ReadTimeout))
	ack, err := r.c.Handshake(c)
	if err != nil {
		tb.Fatalf("mqtttest: %v", err)
	}
	r.Connack = ack
	return r
}

// Conn is the connection, for tests that tune the socket or close it
// without a DISCONNECT.
func (r *Raw) Conn() net.Conn { return r.c.NetConn() }

// Close closes the connection without a DISCONNECT. A second Close is
// harmless.
func (r *Raw) Close() { _ = r.c.Close() }

// Send encodes pk and writes it. A ProtocolVersion of 0 means the
// connection's; the fixed-header flags MQTT requires of PUBREL, SUBSCRIBE
// and UNSUBSCRIBE are set. Use WriteBytes for malformed packets.
func (r *Raw) Send(pk packets.Packet) error { return r.c.Send(pk) }

// Write is Send failing the test on error.
func (r *Raw) Write(pk packets.Packet) {
	r.tb.Helper()
	if err := r.Send(pk); err != nil {
		r.tb.Fatal(err)
	}
}

// WriteBytes writes b as it is: malformed input, say.
func (r *Raw) WriteBytes(b []byte) {
	r.tb.Helper()
	if _, err := r.c.NetConn().Write(b); err != nil {
		r.tb.Fatalf("mqtttest: write bytes: %v", err)
	}
}

// Publish sends a PUBLISH (not a resend: Write one with Dup set for that).
func (r *Raw) Publish(topic string, qos byte, id uint16, payload string) {
	r.tb.Helper()
	r.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName:   topic,
		PacketID:    id,
		Payload:     []byte(payload),
	})
}

// Puback acknowledges the QoS 1 PUBLISH id.
func (r *Raw) Puback(id uint16) {
	r.tb.Helper()
	r.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: id})
}

// Ping sends PINGREQ. Everything the broker wrote before its PINGRESP was
// decided before it read the PINGREQ.
func (r *Raw) Ping() {
	r.tb.Helper()
	r.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
}

// Subscribe subscribes to filter with packet id 1, waits for the SUBACK
// (setting aside what arrives before it for Read) and fails the test unless
// the subscription was granted. It returns the SUBACK.
func (r *Raw) Subscribe(filter string, qos byte) packets.Packet {
	r.tb.Helper()
	ack := r.TrySubscribe(filter, qos)
	if len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] > 2 {
		r.tb.Fatalf("mqtttest: subscribe %s: reason codes %v (%s)", filter, ack.ReasonCodes, ack.Properties.ReasonString)
	}
	return ack
}

// TrySubscribe subscribes to filter and returns the SUBACK, granted or
// not. Its packet ids count down from 65535, away from the ids a broker
// gives its deliveries (mochi keeps both directions in one map).
func (r *Raw) TrySubscribe(filter string, qos byte) packets.Packet {
	r.tb.Helper()
	r.ctrlID++
	r.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    65535 - r.ctrlID,
		Filters:     packets.Subscriptions{{Filter: filter, Qos: qos}},
	})
	return r.ReadUntil(packets.Suback)
}

// Unsubscribe unsubscribes from filter and waits for the UNSUBACK.
func (r *Raw) Unsubscribe(filter string) {
	r.tb.Helper()
	r.ctrlID++
	r.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe, Qos: 1},
		PacketID:    65535 - r.ctrlID,
		Filters:     packets.Subscriptions{{Filter: filter}},
	})
	r.ReadUntil(packets.Unsuback)
}

// Next returns the next packet: one ReadUntil set aside, else one read from
// the connection. The error wraps the read error (io.EOF when the broker
// closed the connection, a net.Error timing out after ReadTimeout).
func (r *Raw) Next() (packets.Packet, error) {
	if len(r.pending) > 0 {
		pk := r.pending[0]
		r.pending = r.pending[1:]
		return pk, nil
	}
	return r.c.NextWithin(ReadTimeout)
}

// Read is Next failing the test on error.
func (r *Raw) Read() packets.Packet {
	r.tb.Helper()
	pk, err := r.Next()
	if err != nil {
		r.tb.Fatal(err)
	}
	return pk
}

// ReadUntil reads until a packet of type typ and returns it; the packets
// before it are set aside, in order, for the next reads.
func (r *Raw) ReadUntil(typ byte) packets.Packet {
	r.tb.Helper()
	var aside []packets.Packet
	for {
		pk := r.Read()
		if pk.FixedHeader.Type == typ {
			r.pending = append(aside, r.pending...)
			return pk
		}
		aside = append(aside, pk)
	}
}
