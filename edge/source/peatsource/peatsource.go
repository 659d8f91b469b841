package peatsource

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/source"
)

// Defaults of Config.
const (
	DefaultFilter    = "#"
	DefaultTopic     = "{topic}"
	DefaultWindow    = 256
	DefaultKeepalive = 30 * time.Second
	DefaultTimeout   = 30 * time.Second
	DefaultMaxPacket = 1<<20 + 64<<10 // a 1 MiB payload and its headers
	// maxBatch bounds the records of one Next (one write here).
	maxBatch = 1024
)

// Config is the other Peat (headquarters) a source pulls one stream from.
type Config struct {
	// URL is mqtt://host:port or mqtts://host:port.
	URL      string
	ClientID string
	Username string
	Password string
	TLS      *tls.Config
	// Filter is the replay filter: the records of the upstream stream
	// that captures it ("#" reaches the stream capturing everything).
	// Offsets of records it does not match become gap markers here.
	Filter string
	// Stream, when set, is the name the upstream's stream must have (its
	// SUBACK says which stream Filter reached): a filter that reaches
	// another stream is refused rather than mirrored.
	Stream string
	// Topic is each record's topic here: {topic} (its own) replaced.
	Topic string
	// Window is how many QoS 1 and 2 records the upstream may have
	// unacknowledged (MQTT 5 Receive Maximum).
	Window    int
	Keepalive time.Duration
	Timeout   time.Duration
	MaxPacket int
	Logger    *slog.Logger
}

// DefaultConfig is a Config with every default set; URL and ClientID
// are the caller's.
func DefaultConfig() Config {
	return Config{Filter: DefaultFilter, Topic: DefaultTopic, Window: DefaultWindow, Keepalive: DefaultKeepalive,
		Timeout: DefaultTimeout, MaxPacket: DefaultMaxPacket}
}

// Validate reports every problem of cfg, each with its field.
func (cfg *Config) Validate() error {
	var errs []error
	if _, _, err := mqttclient.ParseURL(cfg.URL); err != nil {
		errs = append(errs, fmt.Errorf("url: %w", err))
	}
	if cfg.ClientID == "" {
		errs = append(errs, errors.New("client_id: empty"))
	}
	if f := cfg.Filter; f != "" && (strings.HasPrefix(f, "$") || !validFilter(f)) {
		errs = append(errs, fmt.Errorf("filter: %q is not a topic filter", f))
	}
	if t := cfg.Topic; t != "" {
		if err := checkTopic(t); err != nil {
			errs = append(errs, fmt.Errorf("topic: %w", err))
		}
	}
	if cfg.Window < 0 || cfg.Window > 65535 {
		errs = append(errs, fmt.Errorf("window: %d (1-65535)", cfg.Window))
	}
	return errors.Join(errs...)
}

func validFilter(f string) bool {
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) || strings.Contains(l, "+") && l != "+" {
			return false
		}
	}
	return !strings.ContainsRune(f, 0)
}

func checkTopic(tmpl string) error {
	if strings.ContainsAny(strings.ReplaceAll(tmpl, "{topic}", ""), "{}") {
		return fmt.Errorf("%q: the one placeholder is {topic}", tmpl)
	}
	if strings.ContainsAny(tmpl, "+#\x00") || strings.HasPrefix(tmpl, "$") {
		return fmt.Errorf("%q: no wildcards, no leading $", tmpl)
	}
	return nil
}

// Upstream is another Peat a source replays one stream of.
type Upstream struct {
	cfg    Config
	addr   string
	useTLS bool
	// noClients: the upstream's SUBACK said it shows no publishers'
	// client ids, already logged (once, not at every reconnect).
	noClients atomic.Bool
}

var _ source.Upstream = (*Upstream)(nil)

// New checks cfg; it dials nothing.
func New(cfg Config) (*Upstream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("peatsource: %w", err)
	}
	if cfg.Filter == "" {
		cfg.Filter = DefaultFilter
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxPacket <= 0 {
		cfg.MaxPacket = DefaultMaxPacket
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	addr, useTLS, _ := mqttclient.ParseURL(cfg.URL)
	return &Upstream{cfg: cfg, addr: addr, useTLS: useTLS}, nil
}

// String names the upstream and what it replays.
func (u *Upstream) String() string { return u.Origin() + " " + u.cfg.Filter }

// Origin names the broker as a Peat sink to it names itself.
func (u *Upstream) Origin() string { return mqttclient.Origin(u.cfg.URL) }

// subscribeID is the packet id of the one SUBSCRIBE.
const subscribeID = 1

// Connect subscribes to $replay/<end>/+/<filter>, end the mirror's log
// end, once the upstream accepted the session, and returns once the
// SUBACK accepted it: the replay starts with the record after the last
// one the mirror holds.
func (u *Upstream) Connect(ctx context.Context, r source.Resume) (source.Conn, error) {
	next := r.End()
	connect := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			Clean:            true,
			Keepalive:        uint16(u.cfg.Keepalive / time.Second),
			ClientIdentifier: u.cfg.ClientID,
			UsernameFlag:     u.cfg.Username != "",
			Username:         []byte(u.cfg.Username),
			PasswordFlag:     u.cfg.Password != "",
			Password:         []byte(u.cfg.Password),
		},
		Properties: packets.Properties{
			ReceiveMaximum:    uint16(u.cfg.Window),
			MaximumPacketSize: uint32(u.cfg.MaxPacket),
		},
	}
	nc, br, _, err := mqttclient.Connect(ctx, mqttclient.Dial{Addr: u.addr, UseTLS: u.useTLS, TLS: u.cfg.TLS, Timeout: u.cfg.Timeout}, connect)
	if err != nil {
		return nil, err
	}
	c := newConn(u, nc, br, next)
	if err := c.subscribe(ctx); err != nil {
		_ = nc.Close()
		return nil, err
	}
	c.start()
	return c, nil
}

// replayFilter is the subscription that replays from next.
func (u *Upstream) replayFilter(next uint64) string {
	return "$replay/" + strconv.FormatUint(next, 10) + "/+/" + u.cfg.Filter
}

// mapTopic is a record's topic here.
func (u *Upstream) mapTopic(topic string) string {
	if u.cfg.Topic == DefaultTopic {
		return topic
	}
	return strings.ReplaceAll(u.cfg.Topic, "{topic}", topic)
}
