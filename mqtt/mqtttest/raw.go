package mqtttest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// ReadTimeout bounds every read. It only keeps a broken test from hanging:
// a test that expects the broker to close the connection fails after it.
const ReadTimeout = 30 * time.Second

// Connect is what Dial sends in its CONNECT packet.
type Connect struct {
	ClientID string
	// Version is the protocol version: 4 (MQTT 3.1.1) or 5.
	Version byte
	Clean   bool
	// Keepalive is in seconds; 0 turns the broker's keepalive check off.
	Keepalive uint16
	// Properties are the MQTT 5 CONNECT properties, such as ReceiveMaximum.
	Properties packets.Properties
	// Will, if set, is the client's last will.
	Will *Will
	// Username and Password, when not empty, are sent in the CONNECT.
	Username string
	Password string
}

// Will is a last will message.
type Will struct {
	Topic   string
	Payload []byte
	Qos     byte
	Retain  bool
	// Delay is the MQTT 5 Will Delay Interval in seconds.
	Delay uint32
	// Properties are the other MQTT 5 will properties (Content Type,
	// Response Topic, Message Expiry Interval...); Delay overrides their
	// WillDelayInterval.
	Properties packets.Properties
}

// Raw is a connected client that reads and writes only when told to. Next
// and Send return errors and may be called from a goroutine other than the
// test's; the other methods fail the test through tb. Calls must not
// overlap, except one reader with one writer.
type Raw struct {
	tb      testing.TB
	conn    net.Conn
	r       *bufio.Reader
	version byte
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
	r := &Raw{tb: tb, conn: conn, r: bufio.NewReader(conn), version: c.Version}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: c.ClientID,
			Clean:            c.Clean,
			Keepalive:        c.Keepalive,
		},
		Properties: c.Properties,
	}
	if c.Username != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(c.Username)
	}
	if c.Password != "" {
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(c.Password)
	}
	if w := c.Will; w != nil {
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = w.Topic
		pk.Connect.WillPayload = w.Payload
		pk.Connect.WillQos = w.Qos
		pk.Connect.WillRetain = w.Retain
		pk.Connect.WillProperties = w.Properties
		pk.Mods.AllowResponseInfo = true // else mochi's encoder leaves Response Topic and Correlation Data out
		pk.Connect.WillProperties.WillDelayInterval = w.Delay
	}
	r.Write(pk)
	r.Connack = r.Read()
	return r
}

// Conn is the connection, for tests that tune the socket or close it
// without a DISCONNECT.
func (r *Raw) Conn() net.Conn { return r.conn }

// Close closes the connection without a DISCONNECT. A second Close is
// harmless.
func (r *Raw) Close() { _ = r.conn.Close() }

// Send encodes pk and writes it. A ProtocolVersion of 0 means the
// connection's; the fixed-header flags MQTT requires of PUBREL, SUBSCRIBE
// and UNSUBSCRIBE are set. Use WriteBytes for malformed packets.
func (r *Raw) Send(pk packets.Packet) error {
	if pk.ProtocolVersion == 0 {
		pk.ProtocolVersion = r.version
	}
	encode, ok := encoders[pk.FixedHeader.Type]
	if !ok {
		return fmt.Errorf("mqtttest: cannot send packet type %d", pk.FixedHeader.Type)
	}
	switch pk.FixedHeader.Type {
	case packets.Pubrel, packets.Subscribe, packets.Unsubscribe:
		pk.FixedHeader.Qos = 1 // the flags MQTT requires of them
	}
	var buf bytes.Buffer
	if err := encode(&pk, &buf); err != nil {
		return fmt.Errorf("mqtttest: encode packet type %d: %w", pk.FixedHeader.Type, err)
	}
	if _, err := r.conn.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("mqtttest: write packet type %d: %w", pk.FixedHeader.Type, err)
	}
	return nil
}

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
	if _, err := r.conn.Write(b); err != nil {
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
	_ = r.conn.SetReadDeadline(time.Now().Add(ReadTimeout))
	pk := packets.Packet{ProtocolVersion: r.version}
	hb, err := r.r.ReadByte()
	if err != nil {
		return pk, fmt.Errorf("mqtttest: read: %w", err)
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, fmt.Errorf("mqtttest: decode fixed header: %w", err)
	}
	n, _, err := packets.DecodeLength(r.r)
	if err != nil {
		return pk, fmt.Errorf("mqtttest: read remaining length: %w", err)
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(r.r, body); err != nil {
		return pk, fmt.Errorf("mqtttest: read body of packet type %d: %w", pk.FixedHeader.Type, err)
	}
	decode, ok := decoders[pk.FixedHeader.Type]
	if !ok {
		return pk, fmt.Errorf("mqtttest: unexpected packet type %d from a server", pk.FixedHeader.Type)
	}
	if err := decode(&pk, body); err != nil {
		return pk, fmt.Errorf("mqtttest: decode packet type %d: %w", pk.FixedHeader.Type, err)
	}
	return pk, nil
}

// encoders encode every packet a client sends.
var encoders = map[byte]func(*packets.Packet, *bytes.Buffer) error{
	packets.Connect:     (*packets.Packet).ConnectEncode,
	packets.Publish:     (*packets.Packet).PublishEncode,
	packets.Puback:      (*packets.Packet).PubackEncode,
	packets.Pubrec:      (*packets.Packet).PubrecEncode,
	packets.Pubrel:      (*packets.Packet).PubrelEncode,
	packets.Pubcomp:     (*packets.Packet).PubcompEncode,
	packets.Subscribe:   (*packets.Packet).SubscribeEncode,
	packets.Unsubscribe: (*packets.Packet).UnsubscribeEncode,
	packets.Pingreq:     (*packets.Packet).PingreqEncode,
	packets.Disconnect:  (*packets.Packet).DisconnectEncode,
	packets.Auth:        (*packets.Packet).AuthEncode,
}

// decoders decode the body of every packet a server sends.
var decoders = map[byte]func(*packets.Packet, []byte) error{
	packets.Connack:    (*packets.Packet).ConnackDecode,
	packets.Publish:    (*packets.Packet).PublishDecode,
	packets.Puback:     (*packets.Packet).PubackDecode,
	packets.Pubrec:     (*packets.Packet).PubrecDecode,
	packets.Pubrel:     (*packets.Packet).PubrelDecode,
	packets.Pubcomp:    (*packets.Packet).PubcompDecode,
	packets.Suback:     (*packets.Packet).SubackDecode,
	packets.Unsuback:   (*packets.Packet).UnsubackDecode,
	packets.Pingresp:   (*packets.Packet).PingrespDecode,
	packets.Disconnect: (*packets.Packet).DisconnectDecode,
	packets.Auth:       (*packets.Packet).AuthDecode,
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
