package edge

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/peatmq/peat/edge/internal/mqttclient"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/mqttsource"
	"github.com/peatmq/peat/logstore"
)

// SourceConfig is one upstream a node pulls into a stream (edge/source).
// Exactly one kind block is set.
type SourceConfig struct {
	Name string `yaml:"name"`
	// Stream is the stream the source appends to; by default the one
	// stream that captures every topic the source maps to.
	Stream     string             `yaml:"stream"`
	MQTT       *SourceMQTTConfig  `yaml:"mqtt"`
	Kafka      *SourceKafkaConfig `yaml:"kafka"` // config_source_kafka.go
	Peat       *SourcePeatConfig  `yaml:"peat"`  // config_source_peat.go
	Backoff    BackoffConfig      `yaml:"backoff"`
	StallAfter Duration           `yaml:"stall_after"`
}

// sourceKind is one kind block of a source: it checks itself, names the
// local filters its topics map to (to find the source's stream), and
// builds its upstream.
type sourceKind interface {
	kind() string
	validate(p string) []problem
	// mapped are local filters every topic the source stores matches.
	mapped() []string
	upstream(sc SourceConfig, env sourceEnv) (source.Upstream, error)
}

// kinds are the kind blocks set on s.
func (s SourceConfig) kinds() []sourceKind {
	var out []sourceKind
	if s.MQTT != nil {
		out = append(out, s.MQTT)
	}
	if s.Kafka != nil {
		out = append(out, s.Kafka)
	}
	if s.Peat != nil {
		out = append(out, s.Peat)
	}
	return out
}

// SourceMQTTConfig is an MQTT broker a source subscribes to
// (edge/source/mqttsource).
type SourceMQTTConfig struct {
	URL          string               `yaml:"url"`
	ClientID     string               `yaml:"client_id"`
	Version      int                  `yaml:"version"`
	Username     string               `yaml:"username"`
	PasswordFile string               `yaml:"password_file"`
	TLS          SinkTLSConfig        `yaml:"tls"`
	Subscribe    []SourceSubscription `yaml:"subscribe"`
	Strip        string               `yaml:"strip"`
	Topic        string               `yaml:"topic"`
	Keepalive    Duration             `yaml:"keepalive"`
	ReceiveMax   int                  `yaml:"receive_maximum"`
}

// SourceSubscription is one filter subscribed upstream.
type SourceSubscription struct {
	Filter string `yaml:"filter"`
	QoS    int    `yaml:"qos"`
}

// Defaults of a source's fields.
const (
	DefaultSourceVersion = 5
	DefaultSourceQoS     = 1
)

// applySourceDefaults gives the fields a source in the file leaves out
// their defaults; present tells which YAML paths the file has.
func applySourceDefaults(cfg *Config, present map[string]bool) {
	for i := range cfg.Sources {
		s, p := &cfg.Sources[i], fmt.Sprintf("sources[%d]", i)
		if !present[p+".backoff.min"] {
			s.Backoff.Min = Duration(source.DefaultBackoffMin)
		}
		if !present[p+".backoff.max"] {
			s.Backoff.Max = Duration(source.DefaultBackoffMax)
		}
		if !present[p+".stall_after"] {
			s.StallAfter = Duration(source.DefaultStallAfter)
		}
		if s.Kafka != nil {
			applySourceKafkaDefaults(s.Kafka, p+".kafka", present)
		}
		if s.Peat != nil {
			applySourcePeatDefaults(s.Peat, p+".peat", present)
		}
		if m, mp := s.MQTT, p+".mqtt"; m != nil {
			if !present[mp+".version"] {
				m.Version = DefaultSourceVersion
			}
			if !present[mp+".topic"] {
				m.Topic = mqttsource.DefaultTopic
			}
			if !present[mp+".keepalive"] {
				m.Keepalive = Duration(mqttsource.DefaultKeepalive)
			}
			if !present[mp+".receive_maximum"] {
				m.ReceiveMax = mqttsource.DefaultReceiveMaximum
			}
			for j := range m.Subscribe {
				if !present[fmt.Sprintf("%s.subscribe[%d].qos", mp, j)] {
					m.Subscribe[j].QoS = DefaultSourceQoS
				}
			}
		}
	}
}

// validateSources checks the sources section.
func (c Config) validateSources() []problem {
	var probs []problem
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	names := map[string]bool{}
	for i, s := range c.Sources {
		p := fmt.Sprintf("sources[%d]", i)
		switch {
		case !reSinkName.MatchString(s.Name):
			add(p+".name", "%q: want 1 to 64 letters, digits, '_', '-' or '.'", s.Name)
		case names[s.Name]:
			add(p+".name", "duplicate source name %q", s.Name)
		}
		names[s.Name] = true
		if s.Backoff.Min <= 0 {
			add(p+".backoff.min", "must be positive, got %v", s.Backoff.Min)
		}
		if s.Backoff.Max < s.Backoff.Min {
			add(p+".backoff.max", "must be at least backoff.min (%v), got %v", s.Backoff.Min, s.Backoff.Max)
		}
		if s.StallAfter <= 0 {
			add(p+".stall_after", "must be positive, got %v", s.StallAfter)
		}
		kinds := s.kinds()
		switch {
		case len(kinds) == 0:
			add(p, "needs an upstream: mqtt, kafka or peat")
			continue
		case len(kinds) > 1:
			add(p, "has more than one kind of upstream; one source pulls from one upstream")
			continue
		}
		kp := len(probs)
		probs = append(probs, kinds[0].validate(p+"."+kinds[0].kind())...)
		if len(probs) == kp {
			if st, err := c.sourceStream(s); err != nil {
				add(p+".stream", "%v", err)
			} else if msg := c.sourceMirror(s, st); msg != "" {
				add(p+".stream", "%s", msg)
			}
		}
	}
	return probs
}

// sourceMirror says what is wrong with stream as s's: a peat source
// writes a mirror stream (at the upstream's offsets), and no other kind
// may write one.
func (c Config) sourceMirror(s SourceConfig, stream string) string {
	for _, st := range c.Streams {
		switch {
		case st.Name != stream:
		case s.Peat != nil && !st.Mirror:
			return fmt.Sprintf("%s is not a mirror stream (mirror: true): a peat source keeps the upstream's offsets", stream)
		case s.Peat == nil && st.Mirror:
			return fmt.Sprintf("%s is a mirror stream: only a peat source (or a Peat sink upstream) writes one", stream)
		}
	}
	return ""
}

// sourceOrigins are the MQTT upstreams the sources pull from, as
// mqttclient.Origin names them.
func (c Config) sourceOrigins() map[string]bool {
	out := map[string]bool{}
	for _, s := range c.Sources {
		if s.MQTT != nil {
			out[mqttclient.Origin(s.MQTT.URL)] = true
		}
	}
	return out
}

// sinkIDs are the client ids of the MQTT 5 sinks by upstream: what they
// send carries source.PropSink, which a source from the same upstream
// drops.
func (c Config) sinkIDs() map[string][]string {
	out := map[string][]string{}
	for _, s := range c.Sinks {
		if m := s.MQTT; m != nil && m.Version == 5 {
			o := mqttclient.Origin(m.URL)
			out[o] = append(out[o], m.ClientID)
		}
	}
	return out
}

// sourceStream is the stream a source appends to: the one it names,
// which must capture every topic it maps to, or else the one stream
// that does.
func (c Config) sourceStream(s SourceConfig) (string, error) {
	kinds := s.kinds()
	if len(kinds) != 1 {
		return "", fmt.Errorf("source %s has no single upstream", s.Name)
	}
	var filters [][]string
	var names []string
	for _, st := range c.Streams {
		filters = append(filters, st.Filters)
		names = append(names, st.Name)
	}
	router, err := logstore.NewRouter(filters)
	if err != nil {
		return "", err
	}
	reached := map[string]bool{}
	for _, f := range kinds[0].mapped() {
		for _, i := range router.Reach(f) {
			reached[names[i]] = true
		}
	}
	var list []string
	for name := range reached {
		list = append(list, name)
	}
	slices.Sort(list)
	switch {
	case s.Stream != "" && !slices.Contains(names, s.Stream):
		return "", fmt.Errorf("no stream named %q", s.Stream)
	case len(list) == 0:
		return "", fmt.Errorf("no stream captures the topics the source stores (%s)", strings.Join(kinds[0].mapped(), ", "))
	case len(list) > 1:
		return "", fmt.Errorf("the topics the source stores (%s) reach streams %s; a source writes one stream: narrow its topic or its subscriptions",
			strings.Join(kinds[0].mapped(), ", "), strings.Join(list, ", "))
	case s.Stream != "" && list[0] != s.Stream:
		return "", fmt.Errorf("stream %s does not capture the topics the source stores (%s): %s does",
			s.Stream, strings.Join(kinds[0].mapped(), ", "), list[0])
	}
	return list[0], nil
}

func (m *SourceMQTTConfig) kind() string { return "mqtt" }

func (m *SourceMQTTConfig) validate(p string) []problem {
	probs := mqttUpstream{m.URL, m.ClientID, m.Username, m.PasswordFile, m.TLS, m.Keepalive}.validate(p)
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	if m.Version != 4 && m.Version != 5 {
		add(p+".version", "must be 5 or 4 (3.1.1), got %d", m.Version)
	}
	if len(m.Subscribe) == 0 {
		add(p+".subscribe", "must list at least one {filter, qos}")
	}
	for j, s := range m.Subscribe {
		sp := fmt.Sprintf("%s.subscribe[%d]", p, j)
		if err := mqttsource.CheckFilter(s.Filter); err != nil {
			add(sp+".filter", "%v", err)
		}
		if s.QoS < 0 || s.QoS > 2 {
			add(sp+".qos", "must be 0, 1 or 2, got %d", s.QoS)
		}
	}
	if err := mqttsource.CheckTopic(m.Topic); err != nil {
		add(p+".topic", "%v", err)
	}
	if m.ReceiveMax < 1 || m.ReceiveMax > 65535 {
		add(p+".receive_maximum", "must be from 1 to 65535, got %d", m.ReceiveMax)
	}
	return probs
}

// mapped are the local filters of the subscriptions: each filter with
// strip cut, in the topic template. A filter that does not start with
// strip may bring topics that do ("+/cmd/#" with strip "site-a/"), so it
// stands for any topic in the template; so does a template in which
// {topic} is not the last level.
func (m *SourceMQTTConfig) mapped() []string {
	var out []string
	cut, _, _ := strings.Cut(m.Topic, "{topic}")
	for _, s := range m.Subscribe {
		t := "#"
		if rest, ok := strings.CutPrefix(s.Filter, m.Strip); ok && rest != "" {
			t = rest
		}
		f := strings.ReplaceAll(m.Topic, "{topic}", t)
		if logstore.ValidateFilter(f) != nil || t == "#" && !strings.HasSuffix(m.Topic, "{topic}") {
			f = cut + "#"
		}
		out = append(out, f)
	}
	return out
}

func (m *SourceMQTTConfig) upstream(sc SourceConfig, env sourceEnv) (source.Upstream, error) {
	mc := mqttsource.Config{
		URL: m.URL, ClientID: m.ClientID, Version: byte(m.Version), Username: m.Username,
		Strip: m.Strip, Topic: m.Topic, Keepalive: time.Duration(m.Keepalive),
		ReceiveMaximum: m.ReceiveMax, MaxPacket: env.maxPayload + 64<<10,
		Echo: env.sinkIDs[mqttclient.Origin(m.URL)],
	}
	for _, s := range m.Subscribe {
		mc.Subscribe = append(mc.Subscribe, mqttsource.Subscription{Filter: s.Filter, QoS: byte(s.QoS)})
	}
	var err error
	if m.PasswordFile != "" {
		if mc.Password, err = readPassword(m.PasswordFile); err != nil {
			return nil, fmt.Errorf("mqtt.password_file: %w", err)
		}
	}
	if mc.TLS, err = clientTLS(m.TLS); err != nil {
		return nil, fmt.Errorf("mqtt.tls: %w", err)
	}
	return mqttsource.New(mc)
}
