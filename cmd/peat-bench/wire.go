package main

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

// conn is a minimal MQTT 3.1.1 (or 5) client connection: just what a load
// generator needs, with no queues of its own, so the broker is what is
// measured. Packets are encoded and decoded with mochi's packets package.
type conn struct {
	nc      net.Conn
	r       *bufio.Reader
	buf     bytes.Buffer // encode scratch, owned by the writer
	version byte         // MQTT protocol version: 4 (3.1.1) or 5; 0 means 4
}

// dialOptions shape one connection: a subscriber wants a big read buffer,
// one of a thousand sensors a tiny one and a long keep-alive.
type dialOptions struct {
	clean     bool
	keepalive uint16 // seconds
	readBuf   int    // bytes
	// version is the MQTT protocol version, 4 (3.1.1, the default when 0)
	// or 5; receiveMax is an MQTT 5 client's Receive Maximum, the window
	// of unacknowledged QoS 1 deliveries it accepts (0: not sent).
	version    byte
	receiveMax uint16
	// user and password, when user is set, log in (a broker with users).
	user, password string
	// local, when set, is the source IP to connect from (any 127.0.0.0/8
	// address reaches a loopback broker on Linux).
	local string
}

var defaultDial = dialOptions{clean: true, keepalive: 60, readBuf: 64 << 10}

// dial connects as clientID and waits for a successful CONNACK.
// errConnackRefused is a CONNACK that refused the client (bad credentials,
// not authorized): trying again with the same login cannot succeed.
var errConnackRefused = errors.New("refused by CONNACK")

func dial(addr, clientID string, o dialOptions) (*conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if o.local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(o.local)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", clientID, err)
	}
	c := &conn{nc: nc, r: bufio.NewReaderSize(nc, o.readBuf), version: o.version}
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: c.proto(),
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			Clean:            o.clean,
			Keepalive:        o.keepalive,
			ClientIdentifier: clientID,
		},
	}
	if c.proto() == 5 {
		pk.Properties.ReceiveMaximum = o.receiveMax
	}
	if o.user != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(o.user)
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(o.password)
	}
	if err := c.write(&pk); err != nil {
		nc.Close()
		return nil, fmt.Errorf("connect %s: %w", clientID, err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer nc.SetReadDeadline(time.Time{})
	ack, err := c.read()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("connack %s: %w", clientID, err)
	}
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		nc.Close()
		return nil, fmt.Errorf("connect %s: type %d code %#x: %w", clientID, ack.FixedHeader.Type, ack.ReasonCode, errConnackRefused)
	}
	return c, nil
}

// proto is the connection's MQTT protocol version.
func (c *conn) proto() byte {
	if c.version == 0 {
		return 4
	}
	return c.version
}

// write encodes pk and sends it in one write call, as a sensor would.
func (c *conn) write(pk *packets.Packet) error {
	c.buf.Reset()
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&c.buf)
	case packets.Publish:
		err = pk.PublishEncode(&c.buf)
	case packets.Puback:
		err = pk.PubackEncode(&c.buf)
	case packets.Subscribe:
		err = pk.SubscribeEncode(&c.buf)
	case packets.Disconnect:
		err = pk.DisconnectEncode(&c.buf)
	case packets.Pingreq:
		err = pk.PingreqEncode(&c.buf)
	default:
		return fmt.Errorf("cannot encode packet type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		return err
	}
	_, err = c.nc.Write(c.buf.Bytes())
	return err
}

// read reads one packet. The returned packet's byte slices alias a fresh
// buffer, so they stay valid.
func (c *conn) read() (packets.Packet, error) {
	var pk packets.Packet
	pk.ProtocolVersion = c.proto()
	hb, err := c.r.ReadByte()
	if err != nil {
		return pk, err
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	n, err := readVarint(c.r)
	if err != nil {
		return pk, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return pk, err
	}
	pk.FixedHeader.Remaining = n
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Suback:
		err = pk.SubackDecode(body)
	case packets.Pingresp:
	default:
		err = fmt.Errorf("unexpected packet type %d", pk.FixedHeader.Type)
	}
	return pk, err
}

func readVarint(r io.ByteReader) (int, error) {
	var n, shift int
	for i := 0; i < 4; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		n |= int(b&0x7f) << shift
		if b&0x80 == 0 {
			return n, nil
		}
		shift += 7
	}
	return 0, errors.New("malformed remaining length")
}

func (c *conn) subscribe(filter string, qos byte) error {
	_, err := c.subscribeAck(qos, filter)
	return err
}

// subscribeAck subscribes to filters in one SUBSCRIBE and returns the
// SUBACK (an MQTT 5 SUBACK carries properties), failing when any filter is
// refused.
func (c *conn) subscribeAck(qos byte, filters ...string) (packets.Packet, error) {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		ProtocolVersion: c.proto(),
		PacketID:        1,
	}
	for _, f := range filters {
		pk.Filters = append(pk.Filters, packets.Subscription{Filter: f, Qos: qos})
	}
	if err := c.write(&pk); err != nil {
		return pk, err
	}
	ack, err := c.read()
	if err != nil {
		return ack, fmt.Errorf("suback: %w", err)
	}
	if ack.FixedHeader.Type != packets.Suback || len(ack.ReasonCodes) != len(filters) {
		return ack, fmt.Errorf("subscribe %q: got packet type %d with reason codes %v", filters, ack.FixedHeader.Type, ack.ReasonCodes)
	}
	for i, code := range ack.ReasonCodes {
		if code >= 0x80 {
			return ack, fmt.Errorf("subscribe %q refused: reason %#x %s", filters[i], code, ack.Properties.ReasonString)
		}
	}
	return ack, nil
}

func (c *conn) close() {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: c.proto()}
	_ = c.write(&pk)
	c.nc.Close()
}
