package edge

import (
	"fmt"
	"strings"
	"time"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/kafkasource"
)

// SourceKafkaConfig is a Kafka cluster a source consumes
// (edge/source/kafkasource).
type SourceKafkaConfig struct {
	Brokers []string `yaml:"brokers"`
	Topics  []string `yaml:"topics"`
	// Topic is the MQTT topic template: {topic} {partition} {key}
	// {header:NAME}.
	Topic string `yaml:"topic"`
	QoS   int    `yaml:"qos"`
	// Isolation is read_committed (default) or read_uncommitted.
	Isolation string              `yaml:"isolation"`
	Start     string              `yaml:"start"` // earliest | latest
	Group     string              `yaml:"group"`
	MaxBatch  int                 `yaml:"max_batch"`
	ClientID  string              `yaml:"client_id"`
	Timeout   Duration            `yaml:"timeout"`
	TLS       SinkKafkaTLSConfig  `yaml:"tls"`
	SASL      SinkKafkaSASLConfig `yaml:"sasl"`
}

// Isolation levels of a Kafka source.
const (
	IsolationReadCommitted   = "read_committed"
	IsolationReadUncommitted = "read_uncommitted"
)

func applySourceKafkaDefaults(k *SourceKafkaConfig, p string, present map[string]bool) {
	def := kafkasource.DefaultConfig()
	if !present[p+".topic"] {
		k.Topic = def.Topic
	}
	if !present[p+".qos"] {
		k.QoS = int(def.QoS)
	}
	if !present[p+".isolation"] {
		k.Isolation = IsolationReadCommitted
	}
	if !present[p+".start"] {
		k.Start = def.Start
	}
	if !present[p+".max_batch"] {
		k.MaxBatch = def.MaxBatch
	}
	if !present[p+".timeout"] {
		k.Timeout = Duration(def.Timeout)
	}
}

func (k *SourceKafkaConfig) kind() string { return "kafka" }

func (k *SourceKafkaConfig) validate(p string) []problem {
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
	if len(k.Topics) == 0 {
		add(p+".topics", "must list at least one Kafka topic")
	}
	kc := kafkasource.Config{Brokers: []string{"x"}, Topics: k.Topics, Topic: k.Topic, Start: k.Start}
	if err := kc.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			field, msg, _ := strings.Cut(line, ": ")
			add(p+"."+field, "%s", msg)
		}
	}
	if k.QoS < 0 || k.QoS > 2 {
		add(p+".qos", "must be 0, 1 or 2, got %d", k.QoS)
	}
	if k.Isolation != IsolationReadCommitted && k.Isolation != IsolationReadUncommitted {
		add(p+".isolation", "must be %s or %s, got %q", IsolationReadCommitted, IsolationReadUncommitted, k.Isolation)
	}
	if k.MaxBatch < 1 || k.MaxBatch > 100000 {
		add(p+".max_batch", "must be from 1 to 100000, got %d", k.MaxBatch)
	}
	if k.Timeout < Duration(time.Second) {
		add(p+".timeout", "must be at least 1s, got %v", k.Timeout)
	}
	probs = append(probs, validateKafkaConn(p, k.TLS, k.SASL)...)
	return probs
}

// mapped is the local filter every topic of the template matches: its
// levels before the first placeholder, then # (a key or header may hold
// several levels).
func (k *SourceKafkaConfig) mapped() []string {
	if !strings.Contains(k.Topic, "{") {
		return []string{k.Topic}
	}
	head, _, _ := strings.Cut(k.Topic, "{")
	i := strings.LastIndexByte(head, '/')
	return []string{head[:i+1] + "#"}
}

func (k *SourceKafkaConfig) upstream(sc SourceConfig, env sourceEnv) (source.Upstream, error) {
	tlsConf, mech, err := kafkaConn(k.TLS, k.SASL)
	if err != nil {
		return nil, err
	}
	return kafkasource.New(kafkasource.Config{
		Name: sc.Name, Brokers: k.Brokers, Topics: k.Topics, Topic: k.Topic, QoS: byte(k.QoS),
		ReadUncommitted: k.Isolation == IsolationReadUncommitted, Start: k.Start, Group: k.Group,
		MaxBatch: k.MaxBatch, ClientID: k.ClientID, Timeout: time.Duration(k.Timeout),
		TLS: tlsConf, SASL: mech, Logger: env.logger,
	})
}
