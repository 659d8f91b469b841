package sitetest

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

// conn is a minimal MQTT 3.1.1 or 5 client connection, so that the tests
// see exactly what a node answers (a PUBACK's reason code, a closed
// connection) with no client library's queues or retries in between.
type conn struct {
	nc      net.Conn
	r       *bufio.Reader
	buf     bytes.Buffer
	version byte // 4 (3.1.1) or 5
	nextID  uint16
}

// errRefused is a PUBACK or SUBACK with a reason code of 0x80 or more.
var errRefused = errors.New("refused")

func dial(addr, clientID string, version byte) (*conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &conn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), version: version}
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: version,
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60, ClientIdentifier: clientID,
		},
	}
	if version == 5 {
		pk.Properties.ReceiveMaximum = 64
	}
	if err := c.write(&pk); err != nil {
		nc.Close()
		return nil, err
	}
	ack, err := c.readTimeout(20 * time.Second)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("connack: %w", err)
	}
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		nc.Close()
		return nil, fmt.Errorf("connect: packet type %d reason %#x: %w", ack.FixedHeader.Type, ack.ReasonCode, errRefused)
	}
	return c, nil
}

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
	default:
		return fmt.Errorf("cannot encode packet type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		return err
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err = c.nc.Write(c.buf.Bytes())
	return err
}

// readTimeout reads one packet, waiting at most d.
func (c *conn) readTimeout(d time.Duration) (packets.Packet, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	var pk packets.Packet
	pk.ProtocolVersion = c.version
	hb, err := c.r.ReadByte()
	if err != nil {
		return pk, err
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	n, _, err := packets.DecodeLength(c.r)
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
	case packets.Disconnect:
		_ = pk.DisconnectDecode(body)
		err = fmt.Errorf("disconnected by the node: reason %#x %s", pk.ReasonCode, pk.Properties.ReasonString)
	case packets.Pingresp:
	default:
		err = fmt.Errorf("unexpected packet type %d", pk.FixedHeader.Type)
	}
	return pk, err
}

func (c *conn) id() uint16 {
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	return c.nextID
}

// publish sends one QoS 1 PUBLISH and waits up to wait for its PUBACK: nil
// when acknowledged, errRefused (wrapped, with the reason) when a v5
// PUBACK refused it, else the connection's error (a 3.1.1 refusal closes
// the connection).
func (c *conn) publish(topic string, payload []byte, wait time.Duration) error {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: 1},
		ProtocolVersion: c.version,
		TopicName:       topic,
		Payload:         payload,
		PacketID:        c.id(),
	}
	if err := c.write(&pk); err != nil {
		return err
	}
	ack, err := c.readTimeout(wait)
	if err != nil {
		return err
	}
	if ack.FixedHeader.Type != packets.Puback || ack.PacketID != pk.PacketID {
		return fmt.Errorf("got packet type %d id %d, want the PUBACK of %d", ack.FixedHeader.Type, ack.PacketID, pk.PacketID)
	}
	if ack.ReasonCode >= 0x80 {
		return fmt.Errorf("PUBACK reason %#x %q: %w", ack.ReasonCode, ack.Properties.ReasonString, errRefused)
	}
	return nil
}

// subscribe subscribes to filter at qos and waits for the SUBACK.
func (c *conn) subscribe(filter string, qos byte) error {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		ProtocolVersion: c.version,
		PacketID:        c.id(),
		Filters:         packets.Subscriptions{{Filter: filter, Qos: qos}},
	}
	if err := c.write(&pk); err != nil {
		return err
	}
	ack, err := c.readTimeout(20 * time.Second)
	if err != nil {
		return fmt.Errorf("suback: %w", err)
	}
	if ack.FixedHeader.Type != packets.Suback || len(ack.ReasonCodes) != 1 {
		return fmt.Errorf("subscribe %s: got packet type %d", filter, ack.FixedHeader.Type)
	}
	if ack.ReasonCodes[0] >= 0x80 {
		return fmt.Errorf("subscribe %s: reason %#x %s: %w", filter, ack.ReasonCodes[0], ack.Properties.ReasonString, errRefused)
	}
	return nil
}

// puback acknowledges a QoS 1 delivery.
func (c *conn) puback(id uint16) error {
	return c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: c.version, PacketID: id})
}

func (c *conn) close() {
	_ = c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: c.version})
	c.nc.Close()
}
