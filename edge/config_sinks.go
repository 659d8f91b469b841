package edge

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/kafkasink"
	"github.com/peatmq/peat/edge/sink/mqttsink"
	"github.com/peatmq/peat/edge/sink/peatsink"
	"github.com/peatmq/peat/logstore"
)

// SinkConfig is one upstream a node sends streams to (edge/sink). Exactly
// one kind block is set: mqtt, kafka or peat.
type SinkConfig struct {
	Name string `yaml:"name"`
	// Streams are the stream names sent; ["*"] is every stream the node
	// has, including those added while it runs.
	Streams []string `yaml:"streams"`
	// Filter, when set, sends only the records whose topic matches it.
	Filter string `yaml:"filter"`
	// Start is where a sink without a position begins: earliest, latest,
	// an offset or an RFC 3339 time.
	Start      string           `yaml:"start"`
	MQTT       *SinkMQTTConfig  `yaml:"mqtt"`
	Kafka      *SinkKafkaConfig `yaml:"kafka"`
	Peat       *SinkPeatConfig  `yaml:"peat"`
	Backoff    BackoffConfig    `yaml:"backoff"`
	StallAfter Duration         `yaml:"stall_after"`
	MaxRate    float64          `yaml:"max_rate"`
}

// BackoffConfig bounds the wait between reconnects, doubling from Min.
type BackoffConfig struct {
	Min Duration `yaml:"min"`
	Max Duration `yaml:"max"`
}

// SinkMQTTConfig is an MQTT broker upstream (edge/sink/mqttsink).
type SinkMQTTConfig struct {
	URL          string        `yaml:"url"`
	ClientID     string        `yaml:"client_id"`
	Version      int           `yaml:"version"`
	QoS          int           `yaml:"qos"`
	Window       int           `yaml:"window"`
	Username     string        `yaml:"username"`
	PasswordFile string        `yaml:"password_file"`
	TLS          SinkTLSConfig `yaml:"tls"`
	Topic        string        `yaml:"topic"`
	Properties   bool          `yaml:"properties"`
	Keepalive    Duration      `yaml:"keepalive"`
}

// SinkPeatConfig is another Peat that mirrors the streams
// (edge/sink/peatsink): each into its mirror stream named MirrorAs there.
type SinkPeatConfig struct {
	URL          string        `yaml:"url"`
	ClientID     string        `yaml:"client_id"`
	MirrorAs     string        `yaml:"mirror_as"`
	Topic        string        `yaml:"topic"`
	Window       int           `yaml:"window"`
	Username     string        `yaml:"username"`
	PasswordFile string        `yaml:"password_file"`
	TLS          SinkTLSConfig `yaml:"tls"`
	Keepalive    Duration      `yaml:"keepalive"`
}

// SinkTLSConfig is the TLS client side of an mqtts:// upstream.
type SinkTLSConfig struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// SinkKafkaConfig is a Kafka upstream (edge/sink/kafkasink).
type SinkKafkaConfig struct {
	Brokers     []string            `yaml:"brokers"`
	Topic       string              `yaml:"topic"`
	Key         string              `yaml:"key"`
	ExactlyOnce bool                `yaml:"exactly_once"`
	Site        string              `yaml:"site"`
	Window      int                 `yaml:"window"`
	Timeout     Duration            `yaml:"timeout"`
	TLS         SinkKafkaTLSConfig  `yaml:"tls"`
	SASL        SinkKafkaSASLConfig `yaml:"sasl"`
}

// SinkKafkaTLSConfig turns TLS on toward the brokers.
type SinkKafkaTLSConfig struct {
	Enabled       bool `yaml:"enabled"`
	SinkTLSConfig `yaml:",inline"`
}

// SinkKafkaSASLConfig authenticates to the brokers.
type SinkKafkaSASLConfig struct {
	Mechanism    string `yaml:"mechanism"` // plain | scram-sha-256 | scram-sha-512
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
}

// Defaults of a sink's fields.
const (
	DefaultSinkStart   = "earliest"
	DefaultSinkVersion = 5
	DefaultSinkQoS     = 1
)

// defaultSink is a sink with every field but name at its default; a sink
// written in YAML starts from it.
func defaultSink() SinkConfig {
	return SinkConfig{
		Streams:    []string{"*"},
		Start:      DefaultSinkStart,
		Backoff:    BackoffConfig{Min: Duration(sink.DefaultBackoffMin), Max: Duration(sink.DefaultBackoffMax)},
		StallAfter: Duration(sink.DefaultStallAfter),
	}
}

func defaultSinkKafka() SinkKafkaConfig {
	return SinkKafkaConfig{
		Topic:   kafkasink.DefaultTopic,
		Window:  kafkasink.DefaultWindow,
		Timeout: Duration(kafkasink.DefaultTimeout),
	}
}

func defaultSinkMQTT() SinkMQTTConfig {
	return SinkMQTTConfig{
		Version:   DefaultSinkVersion,
		QoS:       DefaultSinkQoS,
		Window:    mqttsink.DefaultWindow,
		Topic:     mqttsink.DefaultTopic,
		Keepalive: Duration(mqttsink.DefaultKeepalive),
	}
}

// applySinkDefaults gives the fields a sink in the file leaves out their
// defaults; present tells which YAML paths the file has.
func applySinkDefaults(cfg *Config, present map[string]bool) {
	def, defM := defaultSink(), defaultSinkMQTT()
	for i := range cfg.Sinks {
		s, p := &cfg.Sinks[i], fmt.Sprintf("sinks[%d]", i)
		if !present[p+".streams"] {
			s.Streams = def.Streams
		}
		if !present[p+".start"] {
			s.Start = def.Start
		}
		if !present[p+".backoff.min"] {
			s.Backoff.Min = def.Backoff.Min
		}
		if !present[p+".backoff.max"] {
			s.Backoff.Max = def.Backoff.Max
		}
		if !present[p+".stall_after"] {
			s.StallAfter = def.StallAfter
		}
		if m, mp := s.MQTT, p+".mqtt"; m != nil {
			if !present[mp+".version"] {
				m.Version = defM.Version
			}
			if !present[mp+".qos"] {
				m.QoS = defM.QoS
			}
			if !present[mp+".window"] {
				m.Window = defM.Window
			}
			if !present[mp+".topic"] {
				m.Topic = defM.Topic
			}
			if !present[mp+".keepalive"] {
				m.Keepalive = defM.Keepalive
			}
		}
		if m, mp := s.Peat, p+".peat"; m != nil {
			if !present[mp+".mirror_as"] {
				m.MirrorAs = peatsink.DefaultMirrorAs
			}
			if !present[mp+".window"] {
				m.Window = defM.Window
			}
			if !present[mp+".topic"] {
				m.Topic = defM.Topic
			}
			if !present[mp+".keepalive"] {
				m.Keepalive = defM.Keepalive
			}
		}
		if k, kp := s.Kafka, p+".kafka"; k != nil {
			defK := defaultSinkKafka()
			if !present[kp+".topic"] {
				k.Topic = defK.Topic
			}
			if !present[kp+".window"] {
				k.Window = defK.Window
			}
			if !present[kp+".timeout"] {
				k.Timeout = defK.Timeout
			}
		}
	}
}

var reSinkName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// validateSinks checks the sinks section.
func (c Config) validateSinks() []problem {
	var probs []problem
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	streams := map[string]bool{}
	for _, s := range c.Streams {
		streams[s.Name] = true
	}
	names := map[string]bool{}
	for i, s := range c.Sinks {
		p := fmt.Sprintf("sinks[%d]", i)
		switch {
		case !reSinkName.MatchString(s.Name):
			add(p+".name", "%q: want 1 to 64 letters, digits, '_', '-' or '.'", s.Name)
		case names[s.Name]:
			add(p+".name", "duplicate sink name %q", s.Name)
		}
		names[s.Name] = true
		switch {
		case len(s.Streams) == 0:
			add(p+".streams", `must list at least one stream, or "*"`)
		case slices.Contains(s.Streams, "*") && len(s.Streams) > 1:
			add(p+".streams", `"*" (every stream) stands alone`)
		case !slices.Contains(s.Streams, "*"):
			for j, name := range s.Streams {
				if !streams[name] {
					add(fmt.Sprintf("%s.streams[%d]", p, j), "no stream named %q", name)
				} else if slices.Index(s.Streams, name) != j {
					add(fmt.Sprintf("%s.streams[%d]", p, j), "stream %q listed twice", name)
				}
			}
		}
		if s.Filter != "" {
			if err := logstore.ValidateFilter(s.Filter); err != nil {
				add(p+".filter", "%v", err)
			}
		}
		if _, err := sink.ParseStart(s.Start); err != nil {
			add(p+".start", "%v", err)
		}
		if s.Backoff.Min <= 0 {
			add(p+".backoff.min", "must be positive, got %v", s.Backoff.Min)
		}
		if s.Backoff.Max < s.Backoff.Min {
			add(p+".backoff.max", "must be at least backoff.min (%v), got %v", s.Backoff.Min, s.Backoff.Max)
		}
		if s.StallAfter <= 0 {
			add(p+".stall_after", "must be positive, got %v", s.StallAfter)
		}
		if s.MaxRate < 0 {
			add(p+".max_rate", "must be 0 (no limit) or positive, got %v", s.MaxRate)
		}
		kinds := 0
		for _, set := range []bool{s.MQTT != nil, s.Kafka != nil, s.Peat != nil} {
			if set {
				kinds++
			}
		}
		switch {
		case kinds == 0:
			add(p, "needs an upstream: mqtt, kafka or peat")
		case kinds > 1:
			add(p, "has more than one of mqtt, kafka and peat; one sink sends to one upstream")
		case s.Peat != nil:
			// A mirror holds every record of its source at its offset: a
			// record skipped on purpose would be refused there as lost.
			if s.Filter != "" {
				add(p+".filter", "a peat sink mirrors whole streams: no filter")
			}
			if s.Start != "earliest" {
				add(p+".start", "a peat sink mirrors whole streams: start must be earliest, got %q", s.Start)
			}
			probs = append(probs, s.Peat.validate(p+".peat")...)
		case s.MQTT != nil:
			probs = append(probs, s.MQTT.validate(p+".mqtt")...)
		default:
			probs = append(probs, s.Kafka.validate(p+".kafka")...)
		}
	}
	return probs
}

func (m *SinkMQTTConfig) validate(p string) []problem {
	probs := mqttUpstream{m.URL, m.ClientID, m.Username, m.PasswordFile, m.TLS, m.Keepalive}.validate(p)
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	if m.Version != 4 && m.Version != 5 {
		add(p+".version", "must be 5 or 4 (3.1.1), got %d", m.Version)
	}
	if m.QoS != 1 && m.QoS != 2 {
		add(p+".qos", "must be 1 or 2, got %d (QoS 0 would lose records)", m.QoS)
	}
	if m.Window < 1 || m.Window > 65535 {
		add(p+".window", "must be from 1 to 65535, got %d", m.Window)
	}
	if err := mqttsink.CheckTopic(m.Topic); err != nil {
		add(p+".topic", "%v", err)
	}
	if m.Properties && m.Version != 5 {
		add(p+".properties", "user properties need version 5")
	}
	return probs
}

func (m *SinkPeatConfig) validate(p string) []problem {
	probs := (&SinkMQTTConfig{
		URL: m.URL, ClientID: m.ClientID, Version: 5, QoS: 1, Window: m.Window,
		Username: m.Username, PasswordFile: m.PasswordFile, TLS: m.TLS,
		Topic: m.Topic, Keepalive: m.Keepalive,
	}).validate(p)
	if err := peatsink.CheckMirrorAs(m.MirrorAs); err != nil {
		probs = append(probs, problem{p + ".mirror_as", err.Error()})
	}
	return probs
}

func (k *SinkKafkaConfig) validate(p string) []problem {
	var probs []problem
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	if len(k.Brokers) == 0 {
		add(p+".brokers", "must list at least one host:port")
	}
	for i, b := range k.Brokers {
		if msg := checkHostPort(b); msg != "" {
			add(fmt.Sprintf("%s.brokers[%d]", p, i), "%s", msg)
		}
	}
	if k.Topic == "" {
		add(p+".topic", "must not be empty")
	} else if err := kafkasink.CheckTemplate(k.Topic, "{stream}", "{node}"); err != nil {
		add(p+".topic", "%v", err)
	}
	if err := kafkasink.CheckTemplate(k.Key, "{topic}", "{stream}", "{node}"); err != nil {
		add(p+".key", "%v", err)
	}
	if k.Site != "" && !reSinkName.MatchString(k.Site) {
		add(p+".site", "%q: want 1 to 64 letters, digits, '_', '-' or '.'", k.Site)
	}
	if k.Window < 1 || k.Window > 65535 {
		add(p+".window", "must be from 1 to 65535, got %d", k.Window)
	}
	if k.Timeout < Duration(time.Second) {
		add(p+".timeout", "must be at least 1s, got %v", k.Timeout)
	}
	probs = append(probs, validateKafkaConn(p, k.TLS, k.SASL)...)
	return probs
}

// validateKafkaConn checks the tls and sasl blocks of a Kafka sink or
// source at path p.
func validateKafkaConn(p string, t SinkKafkaTLSConfig, sa SinkKafkaSASLConfig) []problem {
	var probs []problem
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	if !t.Enabled && t.SinkTLSConfig != (SinkTLSConfig{}) {
		add(p+".tls", "files or server_name set but enabled is false")
	} else if (t.CertFile == "") != (t.KeyFile == "") {
		add(p+".tls", "cert_file and key_file go together")
	}
	switch sa.Mechanism {
	case "":
		if sa.Username != "" || sa.PasswordFile != "" {
			add(p+".sasl.mechanism", "must be set with a username or password_file")
		}
	case "plain", "scram-sha-256", "scram-sha-512":
		if sa.Username == "" {
			add(p+".sasl.username", "must not be empty")
		}
		if sa.PasswordFile == "" {
			add(p+".sasl.password_file", "must not be empty")
		}
	default:
		add(p+".sasl.mechanism", "must be plain, scram-sha-256 or scram-sha-512, got %q", sa.Mechanism)
	}
	return probs
}

// mqttUpstream is what every MQTT upstream block (sinks mqtt and peat,
// sources mqtt and peat) says about its connection.
type mqttUpstream struct {
	url, clientID, username, passwordFile string
	tls                                   SinkTLSConfig
	keepalive                             Duration
}

// validate checks the connection's fields under path p.
func (u mqttUpstream) validate(p string) []problem {
	var probs []problem
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	_, useTLS, err := mqttclient.ParseURL(u.url)
	if err != nil {
		add(p+".url", "%v", err)
	}
	if u.clientID == "" {
		add(p+".client_id", "must not be empty: it names the upstream session")
	} else if len(u.clientID) > 65535 {
		add(p+".client_id", "longer than 65535 bytes")
	}
	if u.passwordFile != "" && u.username == "" {
		add(p+".password_file", "needs a username")
	}
	if u.tls != (SinkTLSConfig{}) && err == nil && !useTLS {
		add(p+".tls", "is set but url is not mqtts://")
	}
	if (u.tls.CertFile == "") != (u.tls.KeyFile == "") {
		add(p+".tls", "cert_file and key_file go together")
	}
	if u.keepalive < Duration(time.Second) || u.keepalive > Duration(65535*time.Second) {
		add(p+".keepalive", "must be from 1s to 65535s, got %v", u.keepalive)
	}
	return probs
}
