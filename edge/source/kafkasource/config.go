package kafkasource

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// Defaults of Config.
const (
	DefaultTopic    = "{topic}"
	DefaultQoS      = 1
	DefaultStart    = StartEarliest
	DefaultMaxBatch = 1000
	DefaultTimeout  = 30 * time.Second
	// DefaultRefresh is how often the source looks for partitions (and
	// topics) that appeared upstream.
	DefaultRefresh = 30 * time.Second
	// DefaultCommitEvery is how often positions go to Config.Group.
	DefaultCommitEvery = 5 * time.Second
)

// Where a partition the log holds nothing of starts.
const (
	StartEarliest = "earliest"
	StartLatest   = "latest"
)

// Config is one Kafka upstream of a source.
type Config struct {
	// Name is the source's name (its position properties carry it).
	Name    string
	Brokers []string
	// Topics are the Kafka topics consumed, every partition of each,
	// assigned by the source itself (no consumer group).
	Topics []string
	// Topic maps a Kafka record to its MQTT topic: {topic} (the Kafka
	// topic), {partition}, {key} (the record key, UTF-8) and
	// {header:NAME} (the value of header NAME) are replaced. A record
	// whose topic comes out empty, with a wildcard, NUL or a leading $ is
	// skipped (logged): it is read again, and skipped again, after a
	// restart, so nothing of it is ever stored.
	Topic string
	// QoS of the records (1 by default: local subscribers get them at
	// least once).
	QoS byte
	// ReadUncommitted reads records of open and aborted transactions
	// too; by default the source reads committed records only
	// (isolation level read_committed).
	ReadUncommitted bool
	// Start is where a partition the log holds nothing of starts:
	// earliest (default) or latest, resolved to an offset when the
	// partition is first assigned and written with the first batch.
	Start string
	// Group, when set, is a Kafka consumer group the source commits its
	// durable positions to every CommitEvery, for Kafka's own lag tools.
	// Only for visibility: the source never reads it back.
	Group       string
	CommitEvery time.Duration
	// MaxBatch bounds the records of one batch (one append here).
	MaxBatch int
	ClientID string
	TLS      *tls.Config
	SASL     sasl.Mechanism
	// Timeout bounds the dial and each request of the source's own
	// (metadata, offsets, group commits).
	Timeout time.Duration
	Refresh time.Duration
	Logger  *slog.Logger
}

// DefaultConfig is a Config with every default set; Name, Brokers and
// Topics are the caller's.
func DefaultConfig() Config {
	return Config{Topic: DefaultTopic, QoS: DefaultQoS, Start: DefaultStart, MaxBatch: DefaultMaxBatch,
		Timeout: DefaultTimeout, Refresh: DefaultRefresh, CommitEvery: DefaultCommitEvery}
}

// Validate reports every problem of cfg, each with its field.
func (cfg *Config) Validate() error {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: none"))
	}
	if len(cfg.Topics) == 0 {
		errs = append(errs, errors.New("topics: none"))
	}
	for i, t := range cfg.Topics {
		if !validKafkaTopic(t) {
			errs = append(errs, fmt.Errorf("topics[%d]: %q is not a Kafka topic name ([a-zA-Z0-9._-], 1-249 characters)", i, t))
		}
	}
	if err := CheckTemplate(cfg.Topic); err != nil {
		errs = append(errs, fmt.Errorf("topic: %w", err))
	}
	if cfg.QoS > 2 {
		errs = append(errs, fmt.Errorf("qos: %d (want 0, 1 or 2)", cfg.QoS))
	}
	switch cfg.Start {
	case "", StartEarliest, StartLatest:
	default:
		errs = append(errs, fmt.Errorf("start: %q (want earliest or latest)", cfg.Start))
	}
	if cfg.MaxBatch < 0 {
		errs = append(errs, fmt.Errorf("max_batch: %d", cfg.MaxBatch))
	}
	return errors.Join(errs...)
}

func (cfg *Config) defaults() {
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.Start == "" {
		cfg.Start = DefaultStart
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.CommitEvery <= 0 {
		cfg.CommitEvery = DefaultCommitEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
}

func validKafkaTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CheckTemplate checks a topic template: its placeholders are {topic},
// {partition}, {key} and {header:NAME}; its literal text has no
// wildcard.
func CheckTemplate(tmpl string) error {
	if strings.ContainsAny(tmpl, "+#\x00") {
		return fmt.Errorf("%q: a topic has no wildcards", tmpl)
	}
	rest := tmpl
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			return nil
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return fmt.Errorf("%q: unclosed {", tmpl)
		}
		ph := rest[i+1 : i+j]
		switch {
		case ph == "topic", ph == "partition", ph == "key":
		case strings.HasPrefix(ph, "header:") && len(ph) > len("header:"):
		default:
			return fmt.Errorf("%q: unknown placeholder {%s} (want {topic}, {partition}, {key} or {header:NAME})", tmpl, ph)
		}
		rest = rest[i+j+1:]
	}
}

// mapTopic is r's MQTT topic by tmpl, and false when it is not one a
// record can have.
func mapTopic(tmpl string, r *kgo.Record) (string, bool) {
	var b strings.Builder
	rest := tmpl
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		b.WriteString(rest[:i])
		switch ph := rest[i+1 : i+j]; {
		case ph == "topic":
			b.WriteString(r.Topic)
		case ph == "partition":
			b.WriteString(strconv.Itoa(int(r.Partition)))
		case ph == "key":
			b.Write(r.Key)
		default:
			name := strings.TrimPrefix(ph, "header:")
			for _, h := range r.Headers {
				if h.Key == name {
					b.Write(h.Value)
					break
				}
			}
		}
		rest = rest[i+j+1:]
	}
	t := b.String()
	ok := t != "" && t[0] != '$' && len(t) <= 65535 && utf8.ValidString(t) && !strings.ContainsAny(t, "+#\x00")
	return t, ok
}
