package edge

import (
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Defaults of the configuration that are edge's own; the MQTT ones come from
// mqtt.DefaultConfig and the storage ones from logstore.
const (
	DefaultDataDir      = "./data"
	DefaultHTTPListen   = "127.0.0.1:8080"
	DefaultLogLevel     = "info"
	DefaultLogFormat    = "text"
	DefaultStreamFilter = "#"
)

// Config is the whole configuration of one node, as written in YAML.
type Config struct {
	// DataDir holds the node's Badger database.
	DataDir string        `yaml:"data_dir"`
	Log     LogConfig     `yaml:"log"`
	HTTP    HTTPConfig    `yaml:"http"`
	MQTT    MQTTConfig    `yaml:"mqtt"`
	Auth    AuthConfig    `yaml:"auth"`
	Storage StorageConfig `yaml:"storage"`
	// Streams are the logs and the topics each captures. A topic no stream
	// captures goes through the MQTT broker without being stored.
	Streams []StreamConfig `yaml:"streams"`
	// Sinks send streams upstream (config_sinks.go); none by default.
	Sinks []SinkConfig `yaml:"sinks"`
	// Sources pull upstream topics into streams (config_sources.go);
	// none by default.
	Sources []SourceConfig `yaml:"sources"`
	// Cluster makes the node one of a site's (config_cluster.go); off by
	// default.
	Cluster ClusterConfig `yaml:"cluster"`

	// sources records, by YAML path, where a value came from when it was
	// not the defaults or the file ("PEAT_DATA_DIR", "flag --data"), so a
	// validation error can say so.
	sources map[string]string
}

// LogConfig sets the node's own log output.
type LogConfig struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // text | json
}

// HTTPConfig sets the HTTP server (metrics, health, API).
type HTTPConfig struct {
	Listen string `yaml:"listen"` // host:port; empty disables HTTP
	// TokensFile holds the API's bearer tokens (http_auth.go); empty:
	// no token asked.
	TokensFile string        `yaml:"tokens_file"`
	TLS        HTTPTLSConfig `yaml:"tls"`
	// AllowPlaintext lets a listener reachable from the network run
	// without TLS.
	AllowPlaintext bool `yaml:"allow_plaintext"`
	// AllowedHosts are the names, besides the node's addresses,
	// localhost and its host name, under which the API answers while
	// TokensFile is empty (http_browser.go).
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// MQTTConfig is the YAML face of mqtt.Config.
type MQTTConfig struct {
	// Listen is one MQTT listener, with TLS and AllowPlaintext below;
	// Listeners is the long form, for several (config_listeners.go).
	Listen          string           `yaml:"listen"`
	Listeners       []ListenerConfig `yaml:"listeners"`
	MaxPayloadBytes ByteSize         `yaml:"max_payload_bytes"`
	Window          int              `yaml:"window"`
	SendWindow      int              `yaml:"send_window"`
	QueueDepth      int              `yaml:"queue_depth"`
	QoS0MaxLag      int              `yaml:"qos0_max_lag"`
	ReadBatch       int              `yaml:"read_batch"`
	ReadBatchBytes  ByteSize         `yaml:"read_batch_bytes"`
	BufferBytes     ByteSize         `yaml:"buffer_bytes"`
	WritesPending   int              `yaml:"writes_pending"`
	TopicAliases    int              `yaml:"topic_aliases"`
	MaxTopicLevels  int              `yaml:"max_topic_levels"`
	GroupStart      string           `yaml:"group_start"`

	ConnectTimeout        Duration `yaml:"connect_timeout"`
	MaxConnectBytes       ByteSize `yaml:"max_connect_bytes"`
	MaxPendingConnections int      `yaml:"max_pending_connections"`
	MaxPendingPerAddress  int      `yaml:"max_pending_per_address"`
	LoginBackoff          Duration `yaml:"login_backoff"`
	MaxLoginBackoff       Duration `yaml:"max_login_backoff"`

	// TLS of the listener (config_auth.go).
	TLS TLSConfig `yaml:"tls"`
	// AllowPlaintext lets a listener reachable from the network run
	// without TLS.
	AllowPlaintext bool `yaml:"allow_plaintext"`
}

// StorageConfig sets how the log uses the machine.
type StorageConfig struct {
	// Profile is pi-zero, pi or server; empty picks pi on arm and arm64,
	// server elsewhere.
	Profile string `yaml:"profile"`
	// RetentionInterval is how often retention is enforced.
	RetentionInterval Duration `yaml:"retention_interval"`
	// ReclaimInterval is the least time between two space reclaims, which
	// block writers while they run.
	ReclaimInterval Duration `yaml:"reclaim_interval"`
	// MinFreeBytes refuses publishes while the disk has less free space;
	// 0 is the profile's reserve scaled to the filesystem
	// (logstore.Profile.Reserve), -1 turns the check off.
	MinFreeBytes ByteSize `yaml:"min_free_bytes"`
	// MappedLimit bounds how much of RSS the pages of Badger's
	// memory-mapped files may take before the store hands them back to
	// the kernel; 0 is the profile's, -1 never.
	MappedLimit ByteSize `yaml:"mapped_limit"`
}

// StreamConfig is one stream.
type StreamConfig struct {
	Name       string          `yaml:"name"`
	Filters    []string        `yaml:"filters"`
	Retention  RetentionConfig `yaml:"retention"`
	Durability string          `yaml:"durability"` // fsync | interval
	// SyncInterval is how often an "interval" stream is fsynced.
	SyncInterval Duration `yaml:"sync_interval"`
	// Linger paces group commits: at most one per Linger, shared by every
	// append arriving meanwhile (logstore.StreamConfig.Linger).
	Linger Duration `yaml:"linger"`
	// LingerQoS0 is the same for QoS 0 publishes, whose publishers wait for
	// nothing (logstore.StreamConfig.LingerQoS0).
	LingerQoS0 Duration `yaml:"qos0_linger"`
	// Mirror: a copy of another Peat's stream, written only by its Peat
	// sink through $mirror/<name> (edge/mirror); it takes no filters.
	Mirror bool `yaml:"mirror"`

	// In a cluster only (config_cluster.go); 0 / false: the cluster's.
	ReplicationFactor     int  `yaml:"replication_factor"`
	MinInsyncReplicas     int  `yaml:"min_insync_replicas"`
	UncleanLeaderElection bool `yaml:"unclean_leader_election"`
	// Acks is all or leader; empty: cluster.acks.
	Acks string `yaml:"acks"`
}

// RetentionConfig bounds what a stream keeps; zero means no bound.
type RetentionConfig struct {
	MaxAge   Duration `yaml:"max_age"`
	MaxBytes ByteSize `yaml:"max_bytes"`
}

// DefaultConfig is what `peat serve` runs with no arguments: one stream,
// "default", capturing every topic, durable by fsync, kept for 7 days.
func DefaultConfig() Config {
	m := mqtt.DefaultConfig()
	return Config{
		DataDir: DefaultDataDir,
		Log:     LogConfig{Level: DefaultLogLevel, Format: DefaultLogFormat},
		HTTP:    HTTPConfig{Listen: DefaultHTTPListen, AllowedHosts: []string{}},
		MQTT: MQTTConfig{
			Listen:          m.Listen,
			MaxPayloadBytes: ByteSize(m.MaxPayload),
			Window:          m.Window,
			SendWindow:      m.SendWindow,
			QueueDepth:      m.QueueDepth,
			QoS0MaxLag:      m.QoS0MaxLag,
			ReadBatch:       m.ReadBatch,
			ReadBatchBytes:  ByteSize(m.ReadBatchBytes),
			BufferBytes:     ByteSize(m.BufferSize),
			WritesPending:   m.WritesPending,
			TopicAliases:    m.TopicAliases,
			MaxTopicLevels:  m.MaxTopicLevels,
			GroupStart:      m.GroupStart,

			ConnectTimeout:        Duration(m.ConnectTimeout),
			MaxConnectBytes:       ByteSize(m.MaxConnectSize),
			MaxPendingConnections: m.MaxPendingConnections,
			MaxPendingPerAddress:  m.MaxPendingPerAddress,
			LoginBackoff:          Duration(m.LoginBackoff),
			MaxLoginBackoff:       Duration(m.MaxLoginBackoff),
			TLS:                   TLSConfig{ClientAuth: "none"},
		},
		Storage: StorageConfig{
			Profile:           "",
			RetentionInterval: Duration(logstore.DefaultRetentionInterval),
			ReclaimInterval:   Duration(logstore.DefaultReclaimInterval),
			MinFreeBytes:      0,
			MappedLimit:       0,
		},
		Streams: []StreamConfig{defaultStream(logstore.DefaultStreamName, DefaultStreamFilter)},
		Cluster: defaultCluster(),
	}
}

// defaultStream is a stream with every field but name and filters at its
// default; a stream written in YAML starts from it.
func defaultStream(name string, filters ...string) StreamConfig {
	return StreamConfig{
		Name:         name,
		Filters:      filters,
		Retention:    RetentionConfig{MaxAge: Duration(logstore.DefaultMaxAge)},
		Durability:   string(logstore.DurabilityFsync),
		SyncInterval: Duration(logstore.DefaultSyncInterval),
		Linger:       Duration(logstore.DefaultLinger),
		LingerQoS0:   Duration(logstore.DefaultLingerQoS0),
	}
}

// hasMirrors reports whether a stream is a mirror (edge/mirror).
func (c Config) hasMirrors() bool {
	for _, s := range c.Streams {
		if s.Mirror {
			return true
		}
	}
	return false
}

// Profile is the storage profile the node runs with: the configured one, or
// the platform's default when none is set.
func (c Config) Profile() logstore.Profile {
	if c.Storage.Profile == "" {
		return logstore.DefaultProfile()
	}
	return logstore.Profile(c.Storage.Profile)
}

// StoreConfig is the logstore configuration this Config describes (Logger
// and Metrics are left for the caller).
func (c Config) StoreConfig() logstore.Config {
	sc := logstore.DefaultConfig()
	sc.Dir = c.DataDir
	sc.Profile = c.Profile()
	sc.RetentionInterval = time.Duration(c.Storage.RetentionInterval)
	sc.ReclaimInterval = time.Duration(c.Storage.ReclaimInterval)
	sc.MinFreeBytes = int64(c.Storage.MinFreeBytes)
	sc.MappedLimit = int64(c.Storage.MappedLimit)
	// In a site a record is committed when the ISR holds it: replication
	// moves the store's commit point, not its own fsync.
	sc.ManualCommit = c.Cluster.Enabled()
	sc.Streams = make([]logstore.StreamConfig, len(c.Streams))
	for i, s := range c.Streams {
		sc.Streams[i] = logstore.StreamConfig{
			Name:         s.Name,
			Filters:      append([]string(nil), s.Filters...),
			MaxAge:       time.Duration(s.Retention.MaxAge),
			MaxBytes:     int64(s.Retention.MaxBytes),
			Durability:   logstore.Durability(s.Durability),
			SyncInterval: time.Duration(s.SyncInterval),
			Linger:       time.Duration(s.Linger),
			LingerQoS0:   time.Duration(s.LingerQoS0),
			Mirror:       s.Mirror,
		}
	}
	return sc
}

// BrokerConfig is the MQTT front-end configuration this Config describes
// (Logger and Metrics are left for the caller).
func (c Config) BrokerConfig() mqtt.Config {
	m := mqtt.DefaultConfig()
	m.Listen = c.MQTT.Listen
	m.Listeners = c.brokerListeners()
	m.MaxPayload = int(c.MQTT.MaxPayloadBytes)
	m.Window = c.MQTT.Window
	m.SendWindow = c.MQTT.SendWindow
	m.QueueDepth = c.MQTT.QueueDepth
	m.QoS0MaxLag = c.MQTT.QoS0MaxLag
	m.ReadBatch = c.MQTT.ReadBatch
	m.ReadBatchBytes = int(c.MQTT.ReadBatchBytes)
	m.BufferSize = int(c.MQTT.BufferBytes)
	m.WritesPending = c.MQTT.WritesPending
	m.TopicAliases = c.MQTT.TopicAliases
	m.MaxTopicLevels = c.MQTT.MaxTopicLevels
	m.GroupStart = c.MQTT.GroupStart
	m.ConnectTimeout = time.Duration(c.MQTT.ConnectTimeout)
	m.MaxConnectSize = int(c.MQTT.MaxConnectBytes)
	m.MaxPendingConnections = c.MQTT.MaxPendingConnections
	m.MaxPendingPerAddress = c.MQTT.MaxPendingPerAddress
	m.LoginBackoff = time.Duration(c.MQTT.LoginBackoff)
	m.MaxLoginBackoff = time.Duration(c.MQTT.MaxLoginBackoff)
	return m
}
