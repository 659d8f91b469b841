// Package rawmqtt is a packet-level MQTT 3.1.1 and 5 client: a net.Conn
// speaking mochi's packet codec, with no queues, retries or
// acknowledgements of its own, so that what the broker does (a PUBACK's
// reason code, a closed connection, its throughput) is what is seen.
//
// It returns errors and imports neither testing nor any of Peat's
// packages: mqtttest.Raw wraps it for tests, cluster/sitetest uses it
// against real `peat` processes, and cmd/peat-bench uses it as its load
// generator.
package rawmqtt

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// ErrRefused is a CONNACK that refused the client (bad credentials, not
// authorized): trying again with the same login cannot succeed. The
// error is a *RefusedError, which carries the reason code.
var ErrRefused = errors.New("refused by CONNACK")

// RefusedError is an answer to a CONNECT other than a successful CONNACK.
type RefusedError struct {
	ClientID string
	Type     byte // the packet type: packets.Connack, or a DISCONNECT
	Code     byte // the reason (MQTT 5) or return (3.1.1) code
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("rawmqtt: connect %s: packet type %d code %#x: %v", e.ClientID, e.Type, e.Code, ErrRefused)
}

// Is makes a RefusedError ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Connect is what a client sends in its CONNECT packet.
type Connect struct {
	ClientID string
	// Version is the protocol version: 4 (MQTT 3.1.1) or 5; 0 means 4.
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

// Conn is one client connection. Calls must not overlap, except one
// reader (Next, Reader) with one writer (Send, Encode).
type Conn struct {
	nc      net.Conn
	r       *bufio.Reader
	buf     bytes.Buffer // encode scratch, owned by the writer
	version byte
	connack packets.Packet
}

// DefaultReadBuffer is New's read buffer when readBuf is 0.
const DefaultReadBuffer = 4 << 10

// New wraps nc, reading through a buffer of readBuf bytes (0:
// DefaultReadBuffer). Send a CONNECT first: Handshake.
func New(nc net.Conn, readBuf int) *Conn {
	if readBuf <= 0 {
		readBuf = DefaultReadBuffer
	}
	return &Conn{nc: nc, r: bufio.NewReaderSize(nc, readBuf), version: 4}
}

// Dial connects to addr within timeout, sends c's CONNECT and waits as
// long for the CONNACK. An answer that is not a successful CONNACK is a
// *RefusedError; the connection is then closed.
func Dial(addr string, c Connect, timeout time.Duration) (*Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("rawmqtt: dial %s: %w", addr, err)
	}
	return Connected(New(nc, 0), c, timeout)
}

// Connected is Handshake requiring a successful CONNACK within timeout;
// on any failure the connection is closed.
func Connected(conn *Conn, c Connect, timeout time.Duration) (*Conn, error) {
	_ = conn.nc.SetReadDeadline(time.Now().Add(timeout))
	ack, err := conn.Handshake(c)
	_ = conn.nc.SetReadDeadline(time.Time{})
	if err == nil && (ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0) {
		err = &RefusedError{ClientID: c.ClientID, Type: ack.FixedHeader.Type, Code: ack.ReasonCode}
	}
	if err != nil {
		_ = conn.nc.Close()
		return nil, err
	}
	return conn, nil
}

// Handshake sends c's CONNECT and returns the broker's answer, a CONNACK
// successful or not. Later packets are of c's protocol version.
func (conn *Conn) Handshake(c Connect) (packets.Packet, error) {
	if c.Version == 0 {
		c.Version = 4
	}
	if c.Version != 4 && c.Version != 5 {
		return packets.Packet{}, fmt.Errorf("rawmqtt: protocol version %d, want 4 or 5", c.Version)
	}
	conn.version = c.Version
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
	if err := conn.Send(pk); err != nil {
		return pk, err
	}
	ack, err := conn.Next()
	if err != nil {
		return ack, fmt.Errorf("rawmqtt: connack: %w", err)
	}
	conn.connack = ack
	return ack, nil
}

// Connack is the broker's answer to Handshake (SessionPresent,
// properties).
func (conn *Conn) Connack() packets.Packet { return conn.connack }

// Version is the connection's protocol version: 4 or 5.
func (conn *Conn) Version() byte { return conn.version }

// NetConn is the connection, for deadlines, socket options and a close
// without a DISCONNECT.
func (conn *Conn) NetConn() net.Conn { return conn.nc }

// Reader is the buffered reader Next reads from, for a reader that parses
// packets itself (a load generator that must not allocate).
func (conn *Conn) Reader() *bufio.Reader { return conn.r }

// Close closes the connection without a DISCONNECT.
func (conn *Conn) Close() error { return conn.nc.Close() }

// Encode encodes pk into a new slice. A ProtocolVersion of 0 means the
// connection's; the fixed-header flags MQTT requires of PUBREL, SUBSCRIBE
// and UNSUBSCRIBE are set.
func (conn *Conn) Encode(pk packets.Packet) ([]byte, error) {
	if err := conn.encode(&pk); err != nil {
		return nil, err
	}
	return bytes.Clone(conn.buf.Bytes()), nil
}

// Send encodes pk as Encode does and writes it in one write call, as a
// device would.
func (conn *Conn) Send(pk packets.Packet) error {
	if err := conn.encode(&pk); err != nil {
		return err
	}
	if _, err := conn.nc.Write(conn.buf.Bytes()); err != nil {
		return fmt.Errorf("rawmqtt: write packet type %d: %w", pk.FixedHeader.Type, err)
	}
	return nil
}

func (conn *Conn) encode(pk *packets.Packet) error {
	if pk.ProtocolVersion == 0 {
		pk.ProtocolVersion = conn.version
	}
	encode, ok := encoders[pk.FixedHeader.Type]
	if !ok {
		return fmt.Errorf("rawmqtt: cannot send packet type %d", pk.FixedHeader.Type)
	}
	switch pk.FixedHeader.Type {
	case packets.Pubrel, packets.Subscribe, packets.Unsubscribe:
		pk.FixedHeader.Qos = 1 // the flags MQTT requires of them
	}
	conn.buf.Reset()
	if err := encode(pk, &conn.buf); err != nil {
		return fmt.Errorf("rawmqtt: encode packet type %d: %w", pk.FixedHeader.Type, err)
	}
	return nil
}

// Next reads one packet, waiting as long as the connection's read
// deadline allows. The packet's byte slices are its own. The error wraps
// the read error (io.EOF when the broker closed the connection, a
// net.Error when the deadline passed).
func (conn *Conn) Next() (packets.Packet, error) {
	pk := packets.Packet{ProtocolVersion: conn.version}
	hb, err := conn.r.ReadByte()
	if err != nil {
		return pk, fmt.Errorf("rawmqtt: read: %w", err)
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, fmt.Errorf("rawmqtt: decode fixed header: %w", err)
	}
	n, _, err := packets.DecodeLength(conn.r)
	if err != nil {
		return pk, fmt.Errorf("rawmqtt: read remaining length: %w", err)
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(conn.r, body); err != nil {
		return pk, fmt.Errorf("rawmqtt: read body of packet type %d: %w", pk.FixedHeader.Type, err)
	}
	decode, ok := decoders[pk.FixedHeader.Type]
	if !ok {
		return pk, fmt.Errorf("rawmqtt: unexpected packet type %d from a server", pk.FixedHeader.Type)
	}
	if err := decode(&pk, body); err != nil {
		return pk, fmt.Errorf("rawmqtt: decode packet type %d: %w", pk.FixedHeader.Type, err)
	}
	return pk, nil
}

// NextWithin is Next waiting at most d.
func (conn *Conn) NextWithin(d time.Duration) (packets.Packet, error) {
	_ = conn.nc.SetReadDeadline(time.Now().Add(d))
	return conn.Next()
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
