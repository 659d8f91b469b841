package edge

import (
	"fmt"
	"strings"
	"time"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/peatsource"
	"github.com/peatmq/peat/logstore"
)

// SourcePeatConfig is another Peat (headquarters) a source replays one
// stream of into a mirror stream here (edge/source/peatsource).
type SourcePeatConfig struct {
	URL          string        `yaml:"url"`
	ClientID     string        `yaml:"client_id"`
	Username     string        `yaml:"username"`
	PasswordFile string        `yaml:"password_file"`
	TLS          SinkTLSConfig `yaml:"tls"`
	// Filter is the replay filter: the upstream stream that captures it
	// is the one mirrored.
	Filter string `yaml:"filter"`
	// UpstreamStream, when set, is the name that stream must have.
	UpstreamStream string   `yaml:"upstream_stream"`
	Topic          string   `yaml:"topic"`
	Window         int      `yaml:"window"`
	Keepalive      Duration `yaml:"keepalive"`
}

func applySourcePeatDefaults(k *SourcePeatConfig, p string, present map[string]bool) {
	def := peatsource.DefaultConfig()
	if !present[p+".filter"] {
		k.Filter = def.Filter
	}
	if !present[p+".topic"] {
		k.Topic = def.Topic
	}
	if !present[p+".window"] {
		k.Window = def.Window
	}
	if !present[p+".keepalive"] {
		k.Keepalive = Duration(def.Keepalive)
	}
}

func (k *SourcePeatConfig) kind() string { return "peat" }

func (k *SourcePeatConfig) validate(p string) []problem {
	probs := mqttUpstream{k.URL, k.ClientID, k.Username, k.PasswordFile, k.TLS, k.Keepalive}.validate(p)
	add := func(path, format string, args ...any) {
		probs = append(probs, problem{path, fmt.Sprintf(format, args...)})
	}
	if strings.HasPrefix(k.Filter, "$") || logstore.ValidateFilter(k.Filter) != nil {
		add(p+".filter", "%q is not a topic filter", k.Filter)
	}
	pc := peatsource.Config{URL: "mqtt://x", ClientID: "x", Topic: k.Topic}
	if err := pc.Validate(); err != nil {
		add(p+".topic", "%v", strings.TrimPrefix(err.Error(), "topic: "))
	}
	if k.Window < 1 || k.Window > 65535 {
		add(p+".window", "must be from 1 to 65535, got %d", k.Window)
	}
	return probs
}

// mapped is the replay filter in the topic template.
func (k *SourcePeatConfig) mapped() []string {
	f := strings.ReplaceAll(k.Topic, "{topic}", k.Filter)
	if logstore.ValidateFilter(f) != nil {
		cut, _, _ := strings.Cut(k.Topic, "{topic}")
		f = cut[:strings.LastIndexByte(cut, '/')+1] + "#"
	}
	return []string{f}
}

func (k *SourcePeatConfig) upstream(sc SourceConfig, env sourceEnv) (source.Upstream, error) {
	pc := peatsource.Config{
		URL: k.URL, ClientID: k.ClientID, Username: k.Username, Filter: k.Filter, Stream: k.UpstreamStream,
		Topic: k.Topic, Window: k.Window, Keepalive: time.Duration(k.Keepalive),
		MaxPacket: env.maxPayload + 64<<10, Logger: env.logger,
	}
	var err error
	if k.PasswordFile != "" {
		if pc.Password, err = readPassword(k.PasswordFile); err != nil {
			return nil, fmt.Errorf("peat.password_file: %w", err)
		}
	}
	if pc.TLS, err = clientTLS(k.TLS); err != nil {
		return nil, fmt.Errorf("peat.tls: %w", err)
	}
	return peatsource.New(pc)
}
