package sitetest

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
)

// conn is a raw MQTT 3.1.1 or 5 client connection (rawmqtt), so that the
// tests see exactly what a node answers (a PUBACK's reason code, a closed
// connection) with no client library's queues or retries in between.
type conn struct {
	*rawmqtt.Conn
	nextID uint16
}

// errRefused is a CONNACK, PUBACK or SUBACK with a reason code of 0x80 or
// more.
var errRefused = errors.New("refused")

// dial connects a clean client with keepalive 60 (an MQTT 5 one with
// Receive Maximum 64), waiting up to 20 s.
func dial(addr, clientID string, version byte) (*conn, error) {
	return dialWithin(addr, clientID, version, 20*time.Second)
}

// dialWithin is dial with a CONNECT timeout of wait.
func dialWithin(addr, clientID string, version byte, wait time.Duration) (*conn, error) {
	c := rawmqtt.Connect{ClientID: clientID, Version: version, Clean: true, Keepalive: 60}
	if version == 5 {
		c.Properties.ReceiveMaximum = 64
	}
	return dialConnect(addr, c, wait)
}

// dialConnect connects with c and waits up to wait in all (the TCP
// connection, at most 5 s of it, and the CONNACK) for a successful
// CONNACK; a refusal is errRefused.
func dialConnect(addr string, c rawmqtt.Connect, wait time.Duration) (*conn, error) {
	deadline := time.Now().Add(wait)
	nc, err := net.DialTimeout("tcp", addr, min(5*time.Second, wait))
	if err != nil {
		return nil, err
	}
	rc, err := rawmqtt.Connected(rawmqtt.New(nc, 64<<10), c, time.Until(deadline))
	if errors.Is(err, rawmqtt.ErrRefused) {
		err = fmt.Errorf("%w: %w", errRefused, err)
	}
	if err != nil {
		return nil, err
	}
	return &conn{Conn: rc}, nil
}

// write sends pk within 10 s.
func (c *conn) write(pk *packets.Packet) error {
	_ = c.NetConn().SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.Send(*pk)
}

// readTimeout reads one packet, waiting at most d. A DISCONNECT from the
// node is an error carrying its reason.
func (c *conn) readTimeout(d time.Duration) (packets.Packet, error) {
	pk, err := c.NextWithin(d)
	if err == nil && pk.FixedHeader.Type == packets.Disconnect {
		err = fmt.Errorf("disconnected by the node: reason %#x %s", pk.ReasonCode, pk.Properties.ReasonString)
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
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName:   topic,
		Payload:     payload,
		PacketID:    c.id(),
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
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    c.id(),
		Filters:     packets.Subscriptions{{Filter: filter, Qos: qos}},
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
	return c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: id})
}

func (c *conn) close() {
	_ = c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	_ = c.Close()
}
