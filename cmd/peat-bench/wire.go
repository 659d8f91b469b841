package main

import (
	"fmt"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
)

// conn is a raw MQTT 3.1.1 (or 5) client connection (rawmqtt): just what
// a load generator needs, with no queues of its own, so the broker is
// what is measured.
type conn struct {
	*rawmqtt.Conn
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

// dial connects as clientID and waits for a successful CONNACK; a
// refusal is a *rawmqtt.RefusedError (rawmqtt.ErrRefused).
func dial(addr, clientID string, o dialOptions) (*conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if o.local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(o.local)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", clientID, err)
	}
	c := rawmqtt.Connect{ClientID: clientID, Version: o.version, Clean: o.clean, Keepalive: o.keepalive}
	if o.version == 5 {
		c.Properties.ReceiveMaximum = o.receiveMax
	}
	if o.user != "" {
		c.Username, c.Password = o.user, o.password
	}
	rc, err := rawmqtt.Connected(rawmqtt.New(nc, o.readBuf), c, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: rc}, nil
}

// write encodes pk and sends it in one write call, as a sensor would.
func (c *conn) write(pk *packets.Packet) error { return c.Send(*pk) }

// read reads one packet. The returned packet's byte slices are its own.
func (c *conn) read() (packets.Packet, error) { return c.Next() }

func (c *conn) subscribe(filter string, qos byte) error {
	_, err := c.subscribeAck(qos, filter)
	return err
}

// subscribeAck subscribes to filters in one SUBSCRIBE and returns the
// SUBACK (an MQTT 5 SUBACK carries properties), failing when any filter is
// refused.
func (c *conn) subscribeAck(qos byte, filters ...string) (packets.Packet, error) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    1,
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
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}}
	_ = c.write(&pk)
	_ = c.Close()
}
