package mqttsource

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/source"
)

// Defaults of Config.
const (
	DefaultKeepalive      = 30 * time.Second
	DefaultTopic          = "{topic}"
	DefaultReceiveMaximum = 64
	DefaultMaxPacket      = 1<<20 + 64<<10 // a 1 MiB payload and its headers
	// maxBatch bounds the messages one Next returns.
	maxBatch = 256
)

// PropPID is the user property of a QoS 1 or 2 record that holds the
// upstream's packet id of its PUBLISH (decimal): the position an MQTT
// source keeps in its records.
const PropPID = source.PropPrefix + "mqtt-pid"

// Subscription is one filter subscribed upstream.
type Subscription struct {
	Filter string
	QoS    byte // 0, 1 or 2
}

// Config is one MQTT upstream a source subscribes to.
type Config struct {
	// URL is mqtt://host:port or mqtts://host:port (port defaults 1883
	// and 8883).
	URL      string
	ClientID string // required: the upstream keeps the session under it
	Version  byte   // 4 (3.1.1) or 5
	Username string
	Password string
	TLS      *tls.Config // for mqtts; nil uses the system roots
	// Subscribe are the filters subscribed upstream, each with its QoS.
	Subscribe []Subscription
	// Strip is cut from the start of each topic received that starts
	// with it; Topic is then the local topic, {topic} standing for what
	// is left.
	Strip string
	Topic string
	// Keepalive is the MQTT keepalive; a PINGREQ goes every half of it,
	// and a connection that brought nothing for a whole one is dead.
	Keepalive time.Duration
	// ReceiveMaximum is how many QoS 1 and 2 messages the upstream may
	// have unacknowledged (announced to an MQTT 5 upstream; a 3.1.1
	// upstream is bounded by its own settings).
	ReceiveMaximum int
	// Echo are the client ids of this node's sinks to the same broker:
	// an MQTT 5 message carrying one of them in source.PropSink is one of
	// this node's own records come back down, and is dropped (reason
	// "echo") and acknowledged.
	Echo []string
	// MaxPacket is the largest PUBLISH accepted (announced to an MQTT 5
	// upstream as its Maximum Packet Size; a 3.1.1 upstream that sends a
	// larger one ends the connection).
	MaxPacket int
}

// CheckTopic checks a topic template: {topic} is its one placeholder.
func CheckTopic(tmpl string) error {
	if tmpl == "" {
		return errors.New("empty topic template")
	}
	if strings.ContainsAny(strings.ReplaceAll(tmpl, "{topic}", ""), "{}") {
		return fmt.Errorf("%q: the one placeholder is {topic}", tmpl)
	}
	if strings.ContainsAny(tmpl, "+#") {
		return fmt.Errorf("%q: wildcards are not allowed in a topic", tmpl)
	}
	if strings.HasPrefix(tmpl, "$") {
		return fmt.Errorf("%q: a local topic may not start with $", tmpl)
	}
	return nil
}

// Map is the local topic of an upstream topic: Strip cut, then Topic's
// {topic} replaced; "" when that leaves no valid local topic.
func Map(strip, tmpl, topic string) string {
	t := strings.TrimPrefix(topic, strip)
	if t == "" && strings.Contains(tmpl, "{topic}") {
		return ""
	}
	out := strings.ReplaceAll(tmpl, "{topic}", t)
	if out == "" || strings.HasPrefix(out, "$") {
		return ""
	}
	return out
}

// MapFilter is the local filter that every topic received on filter maps
// to a topic of (for choosing the stream): Map applied to a filter.
func MapFilter(strip, tmpl, filter string) string {
	return strings.ReplaceAll(tmpl, "{topic}", strings.TrimPrefix(filter, strip))
}

// Upstream is an MQTT broker a source subscribes to.
type Upstream struct {
	cfg    Config
	addr   string
	useTLS bool
	origin string
	// subscribed: this process subscribed once already (a 3.1.1
	// upstream with the session present is not asked again: it would
	// send its retained messages again).
	subscribed bool
}

var _ source.Upstream = (*Upstream)(nil)

// New checks cfg and returns the upstream; it dials nothing.
func New(cfg Config) (*Upstream, error) {
	addr, useTLS, err := mqttclient.ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if cfg.Version == 0 {
		cfg.Version = 5
	}
	if cfg.Version != 4 && cfg.Version != 5 {
		return nil, fmt.Errorf("mqttsource: version %d: want 4 or 5", cfg.Version)
	}
	if cfg.ClientID == "" {
		return nil, errors.New("mqttsource: a client_id is required (the upstream keeps the session under it)")
	}
	if len(cfg.Subscribe) == 0 {
		return nil, errors.New("mqttsource: subscribe names no filter")
	}
	for _, s := range cfg.Subscribe {
		if s.QoS > 2 {
			return nil, fmt.Errorf("mqttsource: %q: QoS %d: want 0, 1 or 2", s.Filter, s.QoS)
		}
		if err := CheckFilter(s.Filter); err != nil {
			return nil, err
		}
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if err := CheckTopic(cfg.Topic); err != nil {
		return nil, err
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	if cfg.ReceiveMaximum <= 0 {
		cfg.ReceiveMaximum = DefaultReceiveMaximum
	}
	cfg.ReceiveMaximum = min(cfg.ReceiveMaximum, 65535)
	if cfg.MaxPacket <= 0 {
		cfg.MaxPacket = DefaultMaxPacket
	}
	return &Upstream{cfg: cfg, addr: addr, useTLS: useTLS, origin: mqttclient.Origin(cfg.URL)}, nil
}

// CheckFilter checks an MQTT topic filter.
func CheckFilter(f string) error {
	if f == "" {
		return errors.New("empty filter")
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		switch {
		case l == "#" && i != len(levels)-1:
			return fmt.Errorf("%q: # must be the last level", f)
		case l != "#" && l != "+" && strings.ContainsAny(l, "+#"):
			return fmt.Errorf("%q: a wildcard must be a whole level", f)
		}
	}
	return nil
}

func (u *Upstream) String() string { return u.cfg.URL }

// Origin is the broker as every Peat client of it names it.
func (u *Upstream) Origin() string { return u.origin }

// Connect dials with a persistent session (clean start off; MQTT 5
// Session Expiry Interval one day), subscribes when the upstream has no
// session for the client id (or, on an MQTT 5 upstream, always, with
// Retain Handling 1 so that retained messages come only for new
// subscriptions), and reads from the log which QoS 2 messages it stored
// and the upstream has not yet released, to recognise their redelivery.
func (u *Upstream) Connect(ctx context.Context, r source.Resume) (source.Conn, error) {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: u.cfg.Version,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			ClientIdentifier: u.cfg.ClientID,
			Keepalive:        uint16(min(max(u.cfg.Keepalive/time.Second, 1), 65535)),
		},
	}
	if u.cfg.Username != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(u.cfg.Username)
	}
	if u.cfg.Password != "" {
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(u.cfg.Password)
	}
	if u.cfg.Version == 5 {
		pk.Properties.SessionExpiryInterval, pk.Properties.SessionExpiryIntervalFlag = mqttclient.SessionExpiry, true
		pk.Properties.ReceiveMaximum = uint16(u.cfg.ReceiveMaximum)
		pk.Properties.MaximumPacketSize = uint32(u.cfg.MaxPacket)
	}
	nc, br, ack, err := mqttclient.Connect(ctx, mqttclient.Dial{
		Addr: u.addr, UseTLS: u.useTLS, TLS: u.cfg.TLS, Timeout: u.cfg.Keepalive,
	}, pk)
	if err != nil {
		return nil, err
	}
	keepalive := u.cfg.Keepalive
	if u.cfg.Version == 5 && ack.Properties.ServerKeepAliveFlag && ack.Properties.ServerKeepAlive > 0 {
		keepalive = min(keepalive, time.Duration(ack.Properties.ServerKeepAlive)*time.Second)
	}
	c := newConn(u, nc, br, keepalive)
	if err := c.resume(ctx, r, ack.SessionPresent); err != nil {
		_ = nc.Close()
		return nil, err
	}
	c.start()
	if u.cfg.Version == 5 || !ack.SessionPresent || !u.subscribed {
		if err := c.subscribe(); err != nil {
			_ = c.Close()
			return nil, err
		}
		u.subscribed = true
	}
	return c, nil
}
