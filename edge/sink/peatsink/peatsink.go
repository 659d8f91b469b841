package peatsink

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/edge/sink/mqttsink"
	"github.com/peatmq/peat/logstore"
)

// DefaultMirrorAs names the mirror stream after the source stream.
const DefaultMirrorAs = "{stream}"

// Config is one Peat upstream.
type Config struct {
	URL      string // mqtt://host:port or mqtts://host:port
	ClientID string
	// MirrorAs names the mirror stream on the upstream: {stream} and
	// {node} are replaced.
	MirrorAs string
	// Topic is each record's topic in the mirror: {topic} (its own),
	// {stream}, {node}; "" keeps the record's topic.
	Topic     string
	Window    int
	Username  string
	Password  string
	TLS       *tls.Config
	Node      string
	Keepalive time.Duration
	// First is the log start of the named source stream (what retention
	// has left); the upstream marks a gap only below it.
	First func(stream string) uint64
}

// CheckMirrorAs checks a mirror_as template.
func CheckMirrorAs(tmpl string) error {
	if tmpl == "" {
		return errors.New("empty template")
	}
	if strings.Contains(tmpl, "{topic}") {
		return fmt.Errorf("%q: {topic} has no place in a stream name (want {stream} or {node})", tmpl)
	}
	if strings.Contains(tmpl, "/") {
		return fmt.Errorf("%q: a stream name is one topic level", tmpl)
	}
	return mqttsink.CheckTopic(tmpl)
}

// New returns the upstream: an MQTT 5, QoS 1 connection publishing each
// record to $mirror/<mirror_as> with its description in user properties.
func New(cfg Config) (*mqttsink.Upstream, error) {
	if cfg.MirrorAs == "" {
		cfg.MirrorAs = DefaultMirrorAs
	}
	if err := CheckMirrorAs(cfg.MirrorAs); err != nil {
		return nil, fmt.Errorf("peatsink: mirror_as %w", err)
	}
	if cfg.First == nil {
		return nil, errors.New("peatsink: First is required")
	}
	if cfg.Topic == "" {
		cfg.Topic = mqttsink.DefaultTopic
	}
	if err := mqttsink.CheckTopic(cfg.Topic); err != nil {
		return nil, fmt.Errorf("peatsink: topic %w", err)
	}
	first, tmpl, node := cfg.First, cfg.Topic, cfg.Node
	return mqttsink.New(mqttsink.Config{
		URL: cfg.URL, ClientID: cfg.ClientID, Version: 5, QoS: 1, Window: cfg.Window,
		Username: cfg.Username, Password: cfg.Password, TLS: cfg.TLS,
		Topic: mirror.Prefix + cfg.MirrorAs, Node: cfg.Node, Properties: true,
		Keepalive:  cfg.Keepalive,
		KeepEchoes: true, // a mirror needs every offset: a skipped record would be a gap there
		Extra: func(stream string, r *logstore.Record) []packets.UserProperty {
			return []packets.UserProperty{
				{Key: mirror.PropTopic, Val: topicOf(tmpl, stream, node, r.Topic)},
				{Key: mirror.PropClient, Val: r.ClientID},
				{Key: mirror.PropQoS, Val: strconv.Itoa(int(r.QoS))},
				{Key: mirror.PropExpiry, Val: strconv.FormatUint(uint64(r.MessageExpiry), 10)},
				{Key: mirror.PropFirst, Val: strconv.FormatUint(first(stream), 10)},
			}
		},
	})
}

// topicOf is a record's topic in the mirror.
func topicOf(tmpl, stream, node, topic string) string {
	if tmpl == mqttsink.DefaultTopic {
		return topic
	}
	t := strings.ReplaceAll(tmpl, "{stream}", stream)
	t = strings.ReplaceAll(t, "{node}", node)
	return strings.ReplaceAll(t, "{topic}", topic)
}
