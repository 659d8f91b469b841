package mqtt

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
)

// Defaults for Config. They are chosen for small boards: a connected sensor
// should cost a few kilobytes, not mochi's default ~145 KB.
const (
	DefaultListen          = "127.0.0.1:1883"
	DefaultMaxPayload      = 1 << 20 // 1 MiB
	DefaultWindow          = 64      // unacked QoS>0 publishes per client (inbound)
	DefaultSendWindow      = 256     // unacked QoS>0 deliveries per subscriber (outbound)
	DefaultQueueDepth      = 256     // live records queued per subscriber before it falls back to its own cursor
	DefaultQoS0MaxLag      = 10000   // records a QoS 0 subscriber may lag before it loses messages
	DefaultReadBatch       = 512     // records per log read
	DefaultReadBatchBytes  = 1 << 20 // bytes per log read
	DefaultBufferSize      = 2048    // socket read/write buffer per client
	DefaultWritesPending   = 64      // mochi's outbound channel per client (only non-log traffic uses it)
	DefaultMaxSessionHours = 24 * 7
	// DefaultMaxTopicLevels bounds the levels of topic names and filters,
	// as peer brokers do: deep enough for any device's naming, shallow
	// enough that no topic's matching costs more than a few microseconds.
	DefaultMaxTopicLevels = 128
	// DefaultTopicAliases is how many topic aliases Peat uses toward an MQTT
	// 5 client that offers them: enough for the handful of topics a device
	// or dashboard follows at a time to go by alias, at about 2 KB per
	// connection for 50-byte topics (2 MB for 1,000 subscribers on a small
	// board), and no more than 16 names for a constrained client to hold
	// whatever maximum its library offers by default.
	DefaultTopicAliases = 16

	DefaultConnectTimeout        = 5 * time.Second
	DefaultMaxConnectSize        = 64 << 10 // bytes of a whole CONNECT packet, will and credentials included
	DefaultMaxPendingConnections = 256      // connections awaiting their CONNACK
	// DefaultMaxPendingPerAddress is an eighth of the pending places: a
	// host with silent sockets holds that much, and leaves the rest to
	// others; a host's own reconnecting clients, each answered in a few
	// milliseconds, rarely have so many unanswered at once.
	DefaultMaxPendingPerAddress = DefaultMaxPendingConnections / 8

	// DefaultLoginBackoff and DefaultMaxLoginBackoff: after a failed
	// login, the next from the same address or for the same user waits
	// 100 ms, doubling with each failure up to 5 s (backoff.go): a device
	// with a wrong password retries a few times a minute, a guesser gets
	// one guess per 5 s per address.
	DefaultLoginBackoff    = 100 * time.Millisecond
	DefaultMaxLoginBackoff = 5 * time.Second
)

// Config is the MQTT front-end's configuration. YAML lives in edge; this is a
// plain struct.
type Config struct {
	// Listen is the TCP address of an MQTT listener named "mqtt", served
	// with TLS when TLS is set; it comes before Listeners. Empty: none.
	Listen string
	// Listeners are more addresses to serve, each with its own protocol
	// (MQTT or WebSocket) and TLS (listeners.go).
	Listeners []Listener
	// MaxPayload is the largest payload accepted, in bytes; larger publishes
	// are refused with a reason (v5) or a disconnect (v3).
	MaxPayload int
	// Window bounds a client's QoS 1/2 publishes awaiting durability (and
	// their acknowledgement); it is the Receive Maximum Peat advertises to
	// MQTT 5 clients, and one that opens more QoS 1/2 flows (QoS 2 until
	// PUBREL) is disconnected with reason 0x93. MQTT 3.1.1 clients wait.
	Window int
	// SendWindow bounds the QoS 1/2 deliveries to a subscriber awaiting its
	// PUBACK; MQTT 5 clients get min(SendWindow, their Receive Maximum). A
	// subscriber gets at most SendWindow messages per round trip: with 64
	// and the 1-2 ms round trip of a loaded 2-core broker, one MQTT 3.1.1
	// subscriber of 10 publishers fell 300 ms behind in half the runs
	// (scripts/bench.sh W2, fsync); with 256 it kept up in every run.
	SendWindow int
	// QueueDepth is how many live records a subscriber may have queued
	// before a QoS 1 subscriber falls back to reading the log by itself and
	// a QoS 0 subscriber starts losing messages (counted).
	QueueDepth int
	// QoS0MaxLag is how many records a QoS 0 delivery may lag behind the
	// log's committed end. A subscriber whose queue is full reads the log
	// with its own cursor (QoS 0 included, so a burst loses nothing); QoS 0
	// records it reaches further behind than this are dropped, each counted.
	QoS0MaxLag int
	// ReadBatch and ReadBatchBytes bound one read from the log.
	ReadBatch      int
	ReadBatchBytes int
	// BufferSize is each client's socket read and write buffer, in bytes.
	BufferSize int
	// WritesPending is mochi's per-client outbound channel length; traffic
	// fed from the log does not use it, so it can be small.
	WritesPending int
	// TopicAliases caps the topic aliases each way on an MQTT 5
	// connection: delivery uses min(TopicAliases, the client's Topic Alias
	// Maximum), least recently used first out, and it is the Topic Alias
	// Maximum announced to clients for their publishes. 0 sends every
	// topic in full and accepts no alias.
	TopicAliases int
	// MaxTopicLevels bounds the levels of a topic name or filter: a deeper
	// filter is refused in the SUBACK (MQTT 5: 0x8F with a reason string;
	// MQTT 3.1.1: 0x80), a deeper publish like any refused publish (MQTT 5
	// QoS 1/2: 0x90 with a reason string; QoS 0 dropped; MQTT 3.1.1:
	// disconnected). Matching costs time in proportion to depth.
	MaxTopicLevels int

	// ConnectTimeout is how long a new connection has to send a complete
	// CONNECT; then it is closed. Until CONNECT, a connection has no
	// keepalive, so without this one that sends nothing stays forever.
	ConnectTimeout time.Duration
	// MaxConnectSize bounds the CONNECT packet, in bytes. mochi allocates
	// a packet's announced size before reading it, so before
	// authentication a connection could otherwise make the broker hold
	// the Maximum Packet Size (max_payload and then some) for nothing.
	MaxConnectSize int
	// MaxPendingConnections bounds the connections that have not been
	// sent a CONNACK yet (not yet authenticated); more are closed at once.
	MaxPendingConnections int
	// MaxPendingPerAddress bounds those of them from one source address
	// (an IPv6 /64); more from it are closed at once.
	MaxPendingPerAddress int
	// LoginBackoff is the wait after one failed login, doubling with each
	// further failure up to MaxLoginBackoff, per source address and per
	// user name (backoff.go); 0 turns the backoff off.
	LoginBackoff    time.Duration
	MaxLoginBackoff time.Duration

	// GroupStart is where a consumer group that never committed starts:
	// "earliest" (the log start, the default) or "latest" (only new
	// records).
	GroupStart string

	// Auth authenticates clients and answers ACL checks: publishes,
	// subscriptions (the filters inside $replay/ and $group/ included) and
	// every record delivered; nil allows everyone everything.
	Auth Auth
	// TLS, when set, is the TLS of Listen's listener: the connection
	// guard (connguard.go) runs in front of it, so the handshake counts
	// against connect_timeout and max_pending_connections.
	TLS *tls.Config

	Logger  *slog.Logger
	Metrics *Metrics // nil: a fresh, unregistered set

	// beforeDelivery, set only by this package's tests, is a mochi hook
	// that runs before delivery's: it can hold a connection between its
	// CONNACK and delivery's OnSessionEstablished.
	beforeDelivery mochi.Hook
}

// groupStart is GroupStart as a position.
func (c Config) groupStart() position {
	if c.GroupStart == "latest" {
		return position{kind: posLatest}
	}
	return position{kind: posEarliest}
}

// DefaultConfig returns a Config with every field set to its default.
func DefaultConfig() Config {
	return Config{
		Listen:         DefaultListen,
		MaxPayload:     DefaultMaxPayload,
		Window:         DefaultWindow,
		SendWindow:     DefaultSendWindow,
		QueueDepth:     DefaultQueueDepth,
		QoS0MaxLag:     DefaultQoS0MaxLag,
		ReadBatch:      DefaultReadBatch,
		ReadBatchBytes: DefaultReadBatchBytes,
		BufferSize:     DefaultBufferSize,
		WritesPending:  DefaultWritesPending,
		TopicAliases:   DefaultTopicAliases,
		MaxTopicLevels: DefaultMaxTopicLevels,
		GroupStart:     "earliest",

		ConnectTimeout:        DefaultConnectTimeout,
		MaxConnectSize:        DefaultMaxConnectSize,
		MaxPendingConnections: DefaultMaxPendingConnections,
		MaxPendingPerAddress:  DefaultMaxPendingPerAddress,
		LoginBackoff:          DefaultLoginBackoff,
		MaxLoginBackoff:       DefaultMaxLoginBackoff,
	}
}

// Validate reports every invalid field, each by name.
func (c Config) Validate() error {
	var errs []error
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			errs = append(errs, fmt.Errorf("listen: %q is not host:port: %w", c.Listen, err))
		}
	}
	errs = append(errs, c.validateListeners()...)
	positive := []struct {
		name string
		v    int
	}{
		{"max_payload", c.MaxPayload},
		{"window", c.Window},
		{"send_window", c.SendWindow},
		{"queue_depth", c.QueueDepth},
		{"qos0_max_lag", c.QoS0MaxLag},
		{"read_batch", c.ReadBatch},
		{"read_batch_bytes", c.ReadBatchBytes},
		{"buffer_size", c.BufferSize},
		{"writes_pending", c.WritesPending},
		{"max_connect_bytes", c.MaxConnectSize},
		{"max_pending_connections", c.MaxPendingConnections},
		{"max_pending_per_address", c.MaxPendingPerAddress},
		{"max_topic_levels", c.MaxTopicLevels},
	}
	for _, p := range positive {
		if p.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %d", p.name, p.v))
		}
	}
	if c.LoginBackoff < 0 || c.LoginBackoff > c.MaxLoginBackoff && c.LoginBackoff > 0 {
		errs = append(errs, fmt.Errorf("login_backoff: 0 (off) to max_login_backoff (%v), got %v", c.MaxLoginBackoff, c.LoginBackoff))
	}
	if c.ConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("connect_timeout: must be positive, got %v", c.ConnectTimeout))
	}
	switch c.GroupStart {
	case "", "earliest", "latest":
	default:
		errs = append(errs, fmt.Errorf("group_start: must be earliest or latest, got %q", c.GroupStart))
	}
	if c.Window > 65535 {
		errs = append(errs, fmt.Errorf("window: at most 65535 (an MQTT Receive Maximum), got %d", c.Window))
	}
	if c.TopicAliases < 0 || c.TopicAliases > 65535 {
		errs = append(errs, fmt.Errorf("topic_aliases: 0 to 65535 (an MQTT Topic Alias Maximum), got %d", c.TopicAliases))
	}
	if c.SendWindow > 65535 {
		errs = append(errs, fmt.Errorf("send_window: at most 65535 (MQTT packet identifiers), got %d", c.SendWindow))
	}
	if c.MaxTopicLevels > 32768 {
		errs = append(errs, fmt.Errorf("max_topic_levels: at most 32768 (levels of a 65535-byte topic), got %d", c.MaxTopicLevels))
	}
	if c.MaxPayload > 268435455 {
		errs = append(errs, fmt.Errorf("max_payload: at most 268435455 (the MQTT limit), got %d", c.MaxPayload))
	}
	return errors.Join(errs...)
}
