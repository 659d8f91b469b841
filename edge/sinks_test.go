package edge

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/edge/status"
	"github.com/peatmq/peat/logstore"
)

func TestParse_SinkDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`
sinks:
  - name: cloud
    mqtt: {url: "mqtt://cloud.example", client_id: site-a}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := defaultSink()
	want.Name = "cloud"
	m := defaultSinkMQTT()
	m.URL, m.ClientID = "mqtt://cloud.example", "site-a"
	want.MQTT = &m
	if len(cfg.Sinks) != 1 || !reflect.DeepEqual(cfg.Sinks[0], want) {
		t.Fatalf("sinks = %+v (mqtt %+v)\nwant %+v (mqtt %+v)", cfg.Sinks, cfg.Sinks[0].MQTT, want, m)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestParse_TheIssuesSinkExample(t *testing.T) {
	cfg, err := Parse([]byte(`
sinks:
  - name: cloud
    streams: [default]
    filter: "sensors/#"
    start: earliest
    mqtt:
      url: mqtts://cloud.example:8883
      client_id: site-a
      version: 5
      qos: 1
      window: 64
      username: site-a
      password_file: /etc/peat/cloud.pass
      tls: {ca_file: /etc/peat/ca.pem, server_name: cloud.example}
      topic: "site-a/{topic}"
      properties: true
    backoff: {min: 1s, max: 2m}
    stall_after: 60s
    max_rate: 0
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if s := cfg.Sinks[0]; s.MQTT.Topic != "site-a/{topic}" || !s.MQTT.Properties || s.Filter != "sensors/#" || s.MQTT.TLS.CAFile == "" {
		t.Fatalf("parsed %+v %+v", s, s.MQTT)
	}
	// The issue's peat sink, with the client id every sink needs.
	cfg, err = Parse([]byte("sinks:\n  - name: hq\n    peat: {url: mqtts://hq.example:8883, mirror_as: \"site-a.{stream}\", client_id: site-a}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if p := cfg.Sinks[0].Peat; p.MirrorAs != "site-a.{stream}" || p.Window != 64 || p.Keepalive != Duration(30*time.Second) {
		t.Fatalf("parsed peat %+v", p)
	}
	cfg, err = Parse([]byte(`
sinks:
  - name: lake
    streams: ["*"]
    kafka:
      brokers: [k1:9093]
      topic: "edge.{stream}"
      key: "{topic}"
      exactly_once: true
      tls: {enabled: true, ca_file: /etc/peat/kafka-ca.pem}
      sasl: {mechanism: scram-sha-512, username: site-a, password_file: /etc/peat/kafka.pass}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if k := cfg.Sinks[0].Kafka; k.Window != 256 || k.Topic != "edge.{stream}" || !k.ExactlyOnce || !k.TLS.Enabled || k.TLS.CAFile == "" {
		t.Fatalf("parsed kafka %+v", k)
	}
}

func TestValidate_SinkProblemsNameTheirField(t *testing.T) {
	good := func() Config {
		c := DefaultConfig()
		s := defaultSink()
		s.Name = "cloud"
		m := defaultSinkMQTT()
		m.URL, m.ClientID = "mqtt://127.0.0.1:1883", "site-a"
		s.MQTT = &m
		c.Sinks = []SinkConfig{s}
		return c
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("the base case is invalid: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(s *SinkConfig)
		want   []string
	}{
		{"name", func(s *SinkConfig) { s.Name = "a/b" }, []string{"sinks[0].name: ", `"a/b"`}},
		{"streams", func(s *SinkConfig) { s.Streams = nil }, []string{"sinks[0].streams: "}},
		{"streams unknown", func(s *SinkConfig) { s.Streams = []string{"nope"} }, []string{"sinks[0].streams[0]: ", `"nope"`}},
		{"streams star", func(s *SinkConfig) { s.Streams = []string{"*", "default"} }, []string{"sinks[0].streams: "}},
		{"filter", func(s *SinkConfig) { s.Filter = "a/#/b" }, []string{"sinks[0].filter: "}},
		{"start", func(s *SinkConfig) { s.Start = "soon" }, []string{"sinks[0].start: ", `"soon"`}},
		{"backoff.min", func(s *SinkConfig) { s.Backoff.Min = 0 }, []string{"sinks[0].backoff.min: "}},
		{"backoff.max", func(s *SinkConfig) { s.Backoff.Max = Duration(time.Millisecond) }, []string{"sinks[0].backoff.max: "}},
		{"stall_after", func(s *SinkConfig) { s.StallAfter = 0 }, []string{"sinks[0].stall_after: "}},
		{"max_rate", func(s *SinkConfig) { s.MaxRate = -1 }, []string{"sinks[0].max_rate: "}},
		{"no kind", func(s *SinkConfig) { s.MQTT = nil }, []string{"sinks[0]: ", "mqtt, kafka or peat"}},
		{"mqtt.url", func(s *SinkConfig) { s.MQTT.URL = "http://x" }, []string{"sinks[0].mqtt.url: ", "mqtt://"}},
		{"mqtt.client_id", func(s *SinkConfig) { s.MQTT.ClientID = "" }, []string{"sinks[0].mqtt.client_id: "}},
		{"mqtt.version", func(s *SinkConfig) { s.MQTT.Version = 3 }, []string{"sinks[0].mqtt.version: "}},
		{"mqtt.qos", func(s *SinkConfig) { s.MQTT.QoS = 0 }, []string{"sinks[0].mqtt.qos: ", "1 or 2"}},
		{"mqtt.window", func(s *SinkConfig) { s.MQTT.Window = 0 }, []string{"sinks[0].mqtt.window: "}},
		{"mqtt.password_file", func(s *SinkConfig) { s.MQTT.PasswordFile = "/x" }, []string{"sinks[0].mqtt.password_file: ", "username"}},
		{"mqtt.tls without mqtts", func(s *SinkConfig) { s.MQTT.TLS.CAFile = "/ca" }, []string{"sinks[0].mqtt.tls: ", "mqtts://"}},
		{"mqtt.tls cert alone", func(s *SinkConfig) { s.MQTT.URL = "mqtts://h"; s.MQTT.TLS.CertFile = "/c" }, []string{"sinks[0].mqtt.tls: ", "key_file"}},
		{"mqtt.topic", func(s *SinkConfig) { s.MQTT.Topic = "a/{site}" }, []string{"sinks[0].mqtt.topic: ", "{site}"}},
		{"mqtt.properties", func(s *SinkConfig) { s.MQTT.Version = 4; s.MQTT.Properties = true }, []string{"sinks[0].mqtt.properties: "}},
		{"mqtt.keepalive", func(s *SinkConfig) { s.MQTT.Keepalive = 0 }, []string{"sinks[0].mqtt.keepalive: "}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mutate(&cfg.Sinks[0])
			wantProblems(t, cfg.Validate(), tc.want)
		})
	}
	kafka := func(mut func(k *SinkKafkaConfig)) func(s *SinkConfig) {
		return func(s *SinkConfig) {
			k := defaultSinkKafka()
			k.Brokers = []string{"127.0.0.1:9092"}
			s.MQTT, s.Kafka = nil, &k
			mut(&k)
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(s *SinkConfig)
		want   []string
	}{
		{"both kinds", func(s *SinkConfig) { k := defaultSinkKafka(); s.Kafka = &k }, []string{"sinks[0]: ", "more than one"}},
		{"kafka.brokers", kafka(func(k *SinkKafkaConfig) { k.Brokers = nil }), []string{"sinks[0].kafka.brokers: "}},
		{"kafka.brokers[0]", kafka(func(k *SinkKafkaConfig) { k.Brokers = []string{"k1"} }), []string{"sinks[0].kafka.brokers[0]: ", "host:port"}},
		{"kafka.topic", kafka(func(k *SinkKafkaConfig) { k.Topic = "e.{topic}" }), []string{"sinks[0].kafka.topic: ", "{topic}"}},
		{"kafka.key", kafka(func(k *SinkKafkaConfig) { k.Key = "{x}" }), []string{"sinks[0].kafka.key: "}},
		{"kafka.window", kafka(func(k *SinkKafkaConfig) { k.Window = 0 }), []string{"sinks[0].kafka.window: "}},
		{"kafka.timeout", kafka(func(k *SinkKafkaConfig) { k.Timeout = 0 }), []string{"sinks[0].kafka.timeout: "}},
		{"kafka.tls", kafka(func(k *SinkKafkaConfig) { k.TLS.CAFile = "/ca" }), []string{"sinks[0].kafka.tls: ", "enabled"}},
		{"kafka.sasl.mechanism", kafka(func(k *SinkKafkaConfig) { k.SASL.Mechanism = "gssapi" }), []string{"sinks[0].kafka.sasl.mechanism: ", "gssapi"}},
		{"kafka.sasl.username", kafka(func(k *SinkKafkaConfig) { k.SASL.Mechanism = "plain"; k.SASL.PasswordFile = "/p" }), []string{"sinks[0].kafka.sasl.username: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mutate(&cfg.Sinks[0])
			wantProblems(t, cfg.Validate(), tc.want)
		})
	}
	peat := func(mut func(s *SinkConfig, p *SinkPeatConfig)) func(s *SinkConfig) {
		return func(s *SinkConfig) {
			p := SinkPeatConfig{URL: "mqtt://hq:1883", ClientID: "site-a", MirrorAs: "site-a.{stream}", Topic: "{topic}", Window: 64,
				Keepalive: Duration(30 * time.Second)}
			s.MQTT, s.Peat = nil, &p
			mut(s, &p)
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(s *SinkConfig)
		want   []string
	}{
		{"peat and mqtt", func(s *SinkConfig) { s.Peat = &SinkPeatConfig{} }, []string{"sinks[0]: ", "more than one"}},
		{"peat.url", peat(func(_ *SinkConfig, p *SinkPeatConfig) { p.URL = "kafka://x" }), []string{"sinks[0].peat.url: "}},
		{"peat.client_id", peat(func(_ *SinkConfig, p *SinkPeatConfig) { p.ClientID = "" }), []string{"sinks[0].peat.client_id: "}},
		{"peat.mirror_as topic", peat(func(_ *SinkConfig, p *SinkPeatConfig) { p.MirrorAs = "{topic}" }), []string{"sinks[0].peat.mirror_as: ", "{topic}"}},
		{"peat.mirror_as level", peat(func(_ *SinkConfig, p *SinkPeatConfig) { p.MirrorAs = "a/{stream}" }), []string{"sinks[0].peat.mirror_as: ", "one topic level"}},
		{"peat.topic", peat(func(_ *SinkConfig, p *SinkPeatConfig) { p.Topic = "a/#" }), []string{"sinks[0].peat.topic: "}},
		{"peat.window", peat(func(_ *SinkConfig, p *SinkPeatConfig) { p.Window = 0 }), []string{"sinks[0].peat.window: "}},
		{"peat filter", peat(func(s *SinkConfig, _ *SinkPeatConfig) { s.Filter = "a/#" }), []string{"sinks[0].filter: ", "whole streams"}},
		{"peat start", peat(func(s *SinkConfig, _ *SinkPeatConfig) { s.Start = "latest" }), []string{"sinks[0].start: ", "earliest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mutate(&cfg.Sinks[0])
			wantProblems(t, cfg.Validate(), tc.want)
		})
	}
	t.Run("peat is valid", func(t *testing.T) {
		cfg := good()
		peat(func(*SinkConfig, *SinkPeatConfig) {})(&cfg.Sinks[0])
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("duplicate name", func(t *testing.T) {
		cfg := good()
		cfg.Sinks = append(cfg.Sinks, cfg.Sinks[0])
		wantProblems(t, cfg.Validate(), []string{"sinks[1].name: ", "duplicate"})
	})
}

// sinkConfig is a node sending every stream to the MQTT broker at addr.
func sinkConfig(t testing.TB, addr string) Config {
	cfg := testConfig(t)
	s := defaultSink()
	s.Name = "cloud"
	s.Backoff = BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(200 * time.Millisecond)}
	m := defaultSinkMQTT()
	m.URL, m.ClientID, m.Topic = "mqtt://"+addr, "site-a", "site-a/{topic}"
	s.MQTT = &m
	cfg.Sinks = []SinkConfig{s}
	return cfg
}

func sinkStatuses(t testing.TB, n *Node) []sink.Status {
	t.Helper()
	code, _, body := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/api/v1/sinks")
	if code != http.StatusOK {
		t.Fatalf("GET /api/v1/sinks: %d %s", code, body)
	}
	var out []sink.Status
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET /api/v1/sinks: %v: %s", err, body)
	}
	return out
}

func TestNode_SinkSendsUpstreamAndKeepsItsPosition(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site-a/#")
	cfg := sinkConfig(t, upstream)
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 50)
	sinktest.WaitFor(t, "50 records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 50 })

	var st []sink.Status
	sinktest.WaitFor(t, "the API showing the sink caught up", 30*time.Second, func() bool {
		st = sinkStatuses(t, n)
		return len(st) == 1 && len(st[0].Streams) == 1 && st[0].Streams[0].CommittedOffset == 50
	})
	if s := st[0]; s.Name != "cloud" || s.Kind != "mqtt" || s.State != sink.StateConnected || s.Streams[0].LagRecords != 0 {
		t.Errorf("GET /api/v1/sinks = %+v, want cloud, mqtt, connected, no lag", s)
	}
	// The gauges follow within the monitor's tick (a second).
	for _, want := range []string{
		`peat_sink_committed_offset{sink="cloud",stream="default"} 50`,
		`peat_sink_acked_records_total{sink="cloud",stream="default"} 50`,
		`peat_sink_state{sink="cloud",state="connected",stream="default"} 1`,
		`peat_sink_lag_records{sink="cloud",stream="default"} 0`,
	} {
		sinktest.WaitFor(t, "/metrics with "+want, 30*time.Second, func() bool {
			_, _, metrics := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/metrics")
			return strings.Contains(string(metrics), want)
		})
	}

	// Pause through the API: the state says so, nothing is sent.
	code, _, body := get(t, http.MethodPost, "http://"+n.HTTPAddr().String()+"/api/v1/sinks/cloud/pause")
	if code != http.StatusOK || !strings.Contains(string(body), `"paused"`) {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, _, _ := get(t, http.MethodPost, "http://"+n.HTTPAddr().String()+"/api/v1/sinks/nope/pause"); code != http.StatusNotFound {
		t.Errorf("pause of an unknown sink: %d, want 404", code)
	}

	// Restart on the same data: the position is kept, nothing is sent twice.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	n2 := startNode(t, cfg)
	publishQoS1(t, n2.MQTTAddr(), "sensors/b", 10)
	sinktest.WaitFor(t, "60 records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 60 })
	time.Sleep(200 * time.Millisecond) // a resend would arrive meanwhile (checked below)
	if got := len(col.Payloads()); got != 60 {
		t.Errorf("upstream got %d messages, want 60: the restart resent records", got)
	}

	// The position is the consumer group $sink.cloud (out of MQTT's reach).
	sinktest.WaitFor(t, "the sink's group at 60", time.Minute, func() bool {
		off, ok, _ := n2.broker.Load().GroupOffset("$sink.cloud", "default")
		return ok && off == 60
	})
}

func TestNode_SinkStartFailsOnAnUnreadablePasswordFile(t *testing.T) {
	cfg := sinkConfig(t, "127.0.0.1:1")
	cfg.Sinks[0].MQTT.Username = "u"
	cfg.Sinks[0].MQTT.PasswordFile = filepath.Join(t.TempDir(), "missing")
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = n.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "password_file") {
		t.Fatalf("Start: %v, want an error naming password_file", err)
	}
}

// The commented sink example in configs/peat.yaml parses and validates
// once uncommented, with every field it documents.
func TestConfig_ExampleSinkIsValid(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "configs", "peat.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(data), "\n# sinks:\n")
	if !ok {
		t.Fatal("configs/peat.yaml has no commented sinks: example")
	}
	example, _, _ = strings.Cut(example, "\n\n") // the comment block ends at a blank line
	var b strings.Builder
	b.WriteString("sinks:\n")
	for _, l := range strings.Split(example, "\n") {
		rest, ok := strings.CutPrefix(l, "# ")
		if !ok {
			break // the example ends at the first line that is no comment
		}
		b.WriteString(rest + "\n")
	}
	cfg, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("the example does not parse: %v\n%s", err, b.String())
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the example is invalid: %v", err)
	}
	s := cfg.Sinks[0]
	if s.Name != "cloud" || s.MQTT == nil || s.MQTT.URL != "mqtts://cloud.example:8883" || !s.MQTT.Properties {
		t.Fatalf("example parsed as %+v %+v", s, s.MQTT)
	}
	if len(cfg.Sinks) != 3 || cfg.Sinks[1].Kafka == nil || !cfg.Sinks[1].Kafka.ExactlyOnce {
		t.Fatalf("want the kafka example as the second sink, got %+v", cfg.Sinks)
	}
	if p := cfg.Sinks[2].Peat; p == nil || p.MirrorAs != "site-a.{stream}" || p.URL != "mqtts://hq.example:8883" {
		t.Fatalf("want the peat example as the third sink, got %+v", cfg.Sinks[2])
	}
}

// An mqtts:// upstream: the node checks the broker's certificate against
// tls.ca_file, and refuses one it does not trust.
func TestNode_SinkOverTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := sinktest.TLSFiles(t, dir)
	upstream, plain := sinktest.StartMosquittoTLS(t, certFile, keyFile)
	col := sinktest.NewCollector(t, plain, "site-a/#")

	cfg := sinkConfig(t, upstream)
	cfg.Sinks[0].MQTT.URL = "mqtts://" + upstream
	cfg.Sinks[0].MQTT.TLS.CAFile = caFile
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 5)
	sinktest.WaitFor(t, "5 records over TLS", time.Minute, func() bool { return len(col.Payloads()) >= 5 })

	// Another CA: the handshake fails, the sink says why, nothing is sent.
	otherCA, _, _ := sinktest.TLSFiles(t, t.TempDir())
	cfg2 := sinkConfig(t, upstream)
	cfg2.Sinks[0].Name = "untrusted"
	cfg2.Sinks[0].MQTT.URL = "mqtts://" + upstream
	cfg2.Sinks[0].MQTT.ClientID = "site-b"
	cfg2.Sinks[0].MQTT.TLS.CAFile = otherCA
	n2 := startNode(t, cfg2)
	sinktest.WaitFor(t, "a TLS error in the status", time.Minute, func() bool {
		st := sinkStatuses(t, n2)
		return len(st) == 1 && strings.Contains(st[0].LastError, "certificate")
	})
	if st := sinkStatuses(t, n2)[0]; st.State == sink.StateConnected {
		t.Errorf("a sink that cannot connect reports %s", st.State)
	}
}

// A node sends a stream to Kafka (franz-go's fake cluster) with
// exactly_once, and the API names the kind.
func TestNode_SinkToKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "edge.default"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := testConfig(t)
	s := defaultSink()
	s.Name = "lake"
	k := defaultSinkKafka()
	k.Brokers, k.Topic, k.Key, k.ExactlyOnce, k.Site = c.ListenAddrs(), "edge.{stream}", "{topic}", true, "site-a"
	s.Kafka = &k
	cfg.Sinks = []SinkConfig{s}
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 20)
	var st []sink.Status
	sinktest.WaitFor(t, "the sink caught up", time.Minute, func() bool {
		st = sinkStatuses(t, n)
		return len(st) == 1 && st[0].Streams[0].CommittedOffset == 20
	})
	if st[0].Kind != "kafka" || st[0].State != sink.StateConnected {
		t.Errorf("status %+v, want kafka, connected", st[0])
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("edge.default"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []*kgo.Record
	for len(got) < 20 && ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	if len(got) != 20 {
		t.Fatalf("%d records in Kafka, want 20", len(got))
	}
	r := got[0]
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	if string(r.Key) != "sensors/a" || h["peat-site"] != "site-a" || h["peat-stream"] != "default" || h["peat-offset"] == "" || h["peat-topic"] != "sensors/a" {
		t.Errorf("record key %q headers %v", r.Key, h)
	}
}

// A black-holed upstream: the API and the metrics say stalled within
// stall_after, and /readyz stays ready (the node still serves).
func TestNode_StalledSinkKeepsTheNodeReady(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	px := sinktest.NewProxy(t, upstream, 0)
	cfg := sinkConfig(t, px.Addr())
	cfg.Sinks[0].StallAfter = Duration(time.Second)
	cfg.Sinks[0].MQTT.Keepalive = Duration(2 * time.Second)
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 5)
	sinktest.WaitFor(t, "connected and caught up", time.Minute, func() bool {
		st := sinkStatuses(t, n)
		return st[0].State == sink.StateConnected && st[0].Streams[0].CommittedOffset == 5
	})
	px.SetMode(sinktest.ModeBlackHole)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 5)
	sinktest.WaitFor(t, "stalled in the API", 30*time.Second, func() bool { return sinkStatuses(t, n)[0].State == sink.StateStalled })
	sinktest.WaitFor(t, "stalled in the metrics", 30*time.Second, func() bool {
		_, _, m := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/metrics")
		return strings.Contains(string(m), `peat_sink_state{sink="cloud",state="stalled",stream="default"} 1`)
	})
	if code, _, body := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %s while a sink is stalled, want 200", code, body)
	}
	st := sinkStatuses(t, n)[0].Streams[0]
	if st.LagRecords != 5 || st.LagSeconds <= 0 {
		t.Errorf("stalled stream status %+v, want 5 records of lag and their age", st)
	}
	// The status document, its alarm and the page say so too.
	doc := getStatus(t, n)
	if len(doc.Sinks) != 1 || doc.Sinks[0].State != "stalled" || doc.Sinks[0].LagRecords != 5 || doc.Sinks[0].Kind != "mqtt" {
		t.Errorf("status sinks %+v, want cloud stalled with 5 records of lag", doc.Sinks)
	}
	if !hasAlarm(doc, status.AlarmSinkStalled) {
		t.Errorf("status alarms %+v, want %s", doc.Alarms, status.AlarmSinkStalled)
	}
	if _, _, page := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/"); !strings.Contains(string(page), `data-sink="cloud"`) ||
		!strings.Contains(string(page), `sink &#34;cloud&#34; stalled`) {
		t.Errorf("the status page shows neither the sink nor its alarm")
	}
	px.SetMode(sinktest.ModePass)
	sinktest.WaitFor(t, "caught up after the black hole", time.Minute, func() bool {
		st := sinkStatuses(t, n)
		return st[0].State == sink.StateConnected && st[0].Streams[0].CommittedOffset == 10
	})
	if doc := getStatus(t, n); hasAlarm(doc, status.AlarmSinkStalled) || doc.Sinks[0].State != "connected" {
		t.Errorf("after catching up: sinks %+v, alarms %+v; want connected, no alarm", doc.Sinks, doc.Alarms)
	}
}

func hasAlarm(doc status.Status, id string) bool {
	for _, a := range doc.Alarms {
		if a.ID == id {
			return true
		}
	}
	return false
}

// An operator's seek (POST /api/v1/sinks/{name}/seek, a commit to the
// sink's group $sink.<name>, which no MQTT client can reach) moves the
// sink: it sends again from there (here: back to offset 5).
func TestNode_SinkFollowsACommitToItsOffsets(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site-a/#")
	n := startNode(t, sinkConfig(t, upstream))
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 20)
	sinktest.WaitFor(t, "20 records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 20 })
	sinktest.WaitFor(t, "position 20", time.Minute, func() bool { return sinkStatuses(t, n)[0].Streams[0].CommittedOffset == 20 })

	seek := func(body string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+n.HTTPAddr().String()+"/api/v1/sinks/cloud/seek", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, bad := range []string{`{"stream":"default"}`, `{"stream":"nope","offset":5}`, `{"stream":"default","offset":999}`, `x`} {
		if code, body := seek(bad); code < 400 {
			t.Fatalf("seek %s: %d %s, want a refusal", bad, code, body)
		}
	}
	if code, body := seek(`{"stream":"default","offset":5}`); code != http.StatusOK {
		t.Fatalf("seek: %d %s", code, body)
	}
	sinktest.WaitFor(t, "offsets 5 to 19 again", time.Minute, func() bool { return len(col.Payloads()) >= 35 })
	got := col.Payloads()
	if got[20] != "m5" || got[34] != "m19" {
		t.Errorf("after the seek the upstream got %v..%v, want m5..m19", got[20], got[34])
	}
	sinktest.WaitFor(t, "position 20 again", time.Minute, func() bool { return sinkStatuses(t, n)[0].Streams[0].CommittedOffset == 20 })
}

// TestNode_SinkOfEveryStreamFollowsNewStreams: a sink of "*" sends a
// stream added while the node runs (as a cluster adds them), from Start,
// and stops sending one removed.
func TestNode_SinkOfEveryStreamFollowsNewStreams(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site-a/#")
	n := startNode(t, sinkConfig(t, upstream)) // streams: ["*"]
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 3)
	sinktest.WaitFor(t, "the first records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 3 })

	store := n.store.Load()
	if _, err := store.AddStream(logstore.StreamConfig{Name: "meters", Filters: []string{"meters/#"}}); err != nil {
		t.Fatal(err)
	}
	sinktest.WaitFor(t, "the new stream in the sink's status", 30*time.Second, func() bool {
		st := sinkStatuses(t, n)
		return len(st) == 1 && len(st[0].Streams) == 2 && st[0].Streams[1].Stream == "meters"
	})
	publishQoS1(t, n.MQTTAddr(), "meters/m1", 4)
	sinktest.WaitFor(t, "the new stream's records upstream", time.Minute, func() bool {
		meters := 0
		for _, topic := range col.Topics() {
			if topic == "site-a/meters/m1" {
				meters++
			}
		}
		return meters == 4
	})
	sinktest.WaitFor(t, "the sink's position in the new stream", 30*time.Second, func() bool {
		st := sinkStatuses(t, n)
		return len(st[0].Streams) == 2 && st[0].Streams[1].CommittedOffset == 4
	})

	if err := store.RemoveStream("meters"); err != nil {
		t.Fatal(err)
	}
	sinktest.WaitFor(t, "the removed stream gone from the sink's status", 30*time.Second, func() bool {
		st := sinkStatuses(t, n)
		return len(st) == 1 && len(st[0].Streams) == 1 && st[0].Streams[0].Stream == "default"
	})
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 2) // the sink still sends the rest
	sinktest.WaitFor(t, "the default stream's later records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 9 })
}

// sinkSeries lists the peat_sink_* lines of n's /metrics for sink in
// stream.
func sinkSeries(t *testing.T, n *Node, sinkName, stream string) []string {
	t.Helper()
	_, _, body := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/metrics")
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "peat_sink_") && strings.Contains(line, `sink="`+sinkName+`"`) &&
			strings.Contains(line, `stream="`+stream+`"`) {
			out = append(out, line)
		}
	}
	return out
}

// TestNode_RemovedStreamLeavesTheSinkMetrics: once a stream a sink sends
// is removed, /metrics shows none of the sink's series in it (no lag,
// position or state frozen at their last values), for a sink of every
// stream and for one that names the stream; the API lists it no more,
// and the other stream's series stay.
func TestNode_RemovedStreamLeavesTheSinkMetrics(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "#")
	cfg := sinkConfig(t, upstream) // cloud: streams ["*"]
	cfg.Streams = append(cfg.Streams, defaultStream("meters", "meters/#"))
	named := cfg.Sinks[0]
	m := *named.MQTT
	named.Name, named.Streams, m.ClientID, m.Topic = "named", []string{"meters"}, "site-a-named", "named/{topic}"
	named.MQTT = &m
	cfg.Sinks = append(cfg.Sinks, named)
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "meters/m1", 5)
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 3)
	sinktest.WaitFor(t, "13 records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 13 })
	for _, s := range []string{"cloud", "named"} {
		series := `peat_sink_committed_offset{sink="` + s + `",stream="meters"}`
		sinktest.WaitFor(t, series+" 5", 30*time.Second, func() bool { return metricValue(t, n, series) == 5 })
	}

	if err := n.store.Load().RemoveStream("meters"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"cloud", "named"} {
		sinktest.WaitFor(t, s+"'s series of the removed stream gone from /metrics", 30*time.Second, func() bool {
			return len(sinkSeries(t, n, s, "meters")) == 0
		})
	}
	sinktest.WaitFor(t, "the removed stream gone from the API", 30*time.Second, func() bool {
		st := sinkStatuses(t, n)
		return len(st) == 2 && len(st[0].Streams) == 1 && len(st[1].Streams) == 0
	})
	// Stay gone: no later update brings them back.
	time.Sleep(1500 * time.Millisecond) // over the monitor's tick
	for _, s := range []string{"cloud", "named"} {
		if got := sinkSeries(t, n, s, "meters"); len(got) != 0 {
			t.Errorf("%s's series of the removed stream came back: %v", s, got)
		}
	}
	publishQoS1(t, n.MQTTAddr(), "sensors/a", 2)
	series := `peat_sink_committed_offset{sink="cloud",stream="default"}`
	sinktest.WaitFor(t, series+" 5", 30*time.Second, func() bool { return metricValue(t, n, series) == 5 })
}
