package edge

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/edge/source/kafkasource"
	"github.com/peatmq/peat/edge/source/peatsource"
)

// parseSources parses a config with the given streams and sources
// sections, on loopback ports.
func parseSources(t *testing.T, yaml string) (Config, error) {
	t.Helper()
	cfg, err := Parse([]byte(yaml))
	if err != nil {
		return cfg, err
	}
	cfg.DataDir = t.TempDir()
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	return cfg, cfg.Validate()
}

func TestConfig_KafkaAndPeatSources(t *testing.T) {
	cfg, err := parseSources(t, `
streams:
  - {name: default, filters: ["#"]}
  - {name: cmds, filters: ["cmd/#"]}
  - {name: hq, mirror: true, filters: ["hq/#"]}
sources:
  - name: lake
    kafka: {brokers: ["k1:9092"], topics: [commands], topic: "cmd/{key}", group: site-a}
  - name: hq
    peat: {url: "mqtt://hq.example", client_id: site-a-down, topic: "hq/{topic}", upstream_stream: default}
`)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Sources[0].Kafka
	if k.Topic != "cmd/{key}" || k.QoS != kafkasource.DefaultQoS || k.Isolation != IsolationReadCommitted ||
		k.Start != "earliest" || k.MaxBatch != kafkasource.DefaultMaxBatch || k.Timeout != Duration(kafkasource.DefaultTimeout) {
		t.Errorf("kafka defaults: %+v", k)
	}
	if st, _ := cfg.sourceStream(cfg.Sources[0]); st != "cmds" {
		t.Errorf("kafka source's stream %q, want cmds", st)
	}
	p := cfg.Sources[1].Peat
	if p.Filter != "#" || p.Window != peatsource.DefaultWindow || p.Keepalive != Duration(peatsource.DefaultKeepalive) {
		t.Errorf("peat defaults: %+v", p)
	}
	if st, _ := cfg.sourceStream(cfg.Sources[1]); st != "hq" {
		t.Errorf("peat source's stream %q, want hq", st)
	}

	for _, tc := range []struct{ yaml, want string }{
		{`kafka: {brokers: [], topics: ["a b"], topic: "x/{nope}", isolation: dirty, start: middle, qos: 3, max_batch: 0}`,
			"sources[0].kafka.brokers, sources[0].kafka.topics[0], sources[0].kafka.topic, sources[0].kafka.start, sources[0].kafka.qos, sources[0].kafka.isolation, sources[0].kafka.max_batch"},
		{`kafka: {brokers: ["k:9092"], topics: [a], topic: "hq/{key}"}`, "is a mirror stream"},
		{`peat: {url: "http://x", client_id: "", filter: "a/#/b", window: 0}`,
			"sources[0].peat.url, sources[0].peat.client_id, sources[0].peat.filter, sources[0].peat.window"},
		{`peat: {url: "mqtt://x", client_id: a, topic: "cmd/{topic}"}`, "is not a mirror stream"},
	} {
		_, err := parseSources(t, `
streams:
  - {name: default, filters: ["#"]}
  - {name: cmds, filters: ["cmd/#"]}
  - {name: hq, mirror: true, filters: ["hq/#"]}
sources:
  - name: s
    `+tc.yaml+"\n")
		for _, want := range strings.Split(tc.want, ", ") {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %v, want it to name %s", tc.yaml, err, want)
			}
		}
	}
}

// subscribeLocal subscribes to filter on a node and collects payloads.
func subscribeLocal(t *testing.T, n *Node, filter string) func() []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID(fmt.Sprintf("sub-%d", time.Now().UnixNano())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	if tok := c.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		got = append(got, m.Topic()+"="+string(m.Payload()))
		mu.Unlock()
	}); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// A node with a kafka source: records produced to Kafka reach a local
// subscriber under the mapped topic, and the source's status shows them.
func TestNode_KafkaSourceDeliversLocally(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "commands"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	cfg, err := parseSources(t, fmt.Sprintf(`
streams:
  - {name: default, filters: ["#"]}
  - {name: cmds, filters: ["cmd/#"]}
sources:
  - name: lake
    backoff: {min: 50ms, max: 200ms}
    kafka: {brokers: ["%s"], topics: [commands], topic: "cmd/{key}"}
`, kc.ListenAddrs()[0]))
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, cfg)
	got := subscribeLocal(t, n, "cmd/#")
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic("commands"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := range 20 {
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Key: []byte("dev" + strconv.Itoa(i%2)), Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "20 commands delivered", func() bool { return len(got()) == 20 })
	seen := map[string]bool{}
	for _, m := range got() {
		seen[m] = true
	}
	if !seen["cmd/dev0=0"] || !seen["cmd/dev1=19"] {
		t.Errorf("delivered %v", got())
	}
	if st := n.sourceStatuses(); len(st) != 1 || st[0].Kind != "kafka" || st[0].Appended != 20 {
		t.Errorf("status %+v", st)
	}
}

// A site node with a peat source mirrors HQ's stream at HQ's offsets, and
// a local subscriber of the mirror's topics gets the records.
func TestNode_PeatSourceMirrorsHQ(t *testing.T) {
	hq := startNode(t, testConfig(t))
	cfg, err := parseSources(t, fmt.Sprintf(`
streams:
  - {name: default, filters: ["#"]}
  - {name: hq, mirror: true, filters: ["hq/#"]}
sources:
  - name: hq
    backoff: {min: 50ms, max: 200ms}
    peat: {url: "mqtt://%s", client_id: site-a-down, topic: "hq/{topic}", upstream_stream: default}
`, hq.MQTTAddr()))
	if err != nil {
		t.Fatal(err)
	}
	site := startNode(t, cfg)
	got := subscribeLocal(t, site, "hq/#")
	publishQoS1(t, hq.MQTTAddr(), "cmd/dev1", 50)
	mirrorSt := site.Store().Stream("hq")
	eventually(t, "mirrored", func() bool { return mirrorSt.Committed() == 50 })
	recs, err := mirrorSt.Read(0, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	hqRecs, _ := hq.Store().Stream("default").Read(0, 100, 0)
	for i, r := range recs {
		if r.Offset != hqRecs[i].Offset || string(r.Payload) != string(hqRecs[i].Payload) || r.Topic != "hq/cmd/dev1" {
			t.Fatalf("mirror record %d: %d %q %q, hq %d %q", i, r.Offset, r.Topic, r.Payload, hqRecs[i].Offset, hqRecs[i].Payload)
		}
	}
	eventually(t, "delivered locally", func() bool { return len(got()) == 50 })
}

// The commented kafka and peat source examples in configs/peat.yaml
// parse and validate once uncommented, beside streams they can write.
func TestConfig_ExampleSourcesAreValid(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "configs", "peat.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(data), "\n# sources (kafka, peat):\n")
	if !ok {
		t.Fatal("configs/peat.yaml has no commented kafka and peat sources example")
	}
	example, _, _ = strings.Cut(example, "\n\n")
	var b strings.Builder
	b.WriteString(`streams:
  - {name: default, filters: ["#"]}
  - {name: cmds, filters: ["cmd/#"]}
  - {name: hq.default, mirror: true, filters: ["hq/#"]}
sources:
`)
	for _, l := range strings.Split(example, "\n") {
		if rest, ok := strings.CutPrefix(l, "# "); ok {
			b.WriteString(rest + "\n")
		}
	}
	cfg, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("the example does not parse: %v\n%s", err, b.String())
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the example is invalid: %v", err)
	}
	var kafka, peat *SourceConfig
	for i, s := range cfg.Sources {
		switch {
		case s.Kafka != nil:
			kafka = &cfg.Sources[i]
		case s.Peat != nil:
			peat = &cfg.Sources[i]
		}
	}
	if kafka == nil || kafka.Kafka.Topic != "cmd/{key}" || kafka.Kafka.Topics[0] != "commands" {
		t.Errorf("kafka example: %+v", kafka)
	}
	if peat == nil || peat.Peat.UpstreamStream != "commands" || peat.Stream != "hq.default" {
		t.Errorf("peat example: %+v", peat)
	}
}

// A kafka sink and a kafka source on one cluster, the source reading the
// topic the sink writes into the stream the sink sends: a record
// published here goes up once and comes down once, and the sink never
// sends what came down back up (no echo), so the counts stay bounded.
func TestNode_KafkaSinkAndSourceOnOneClusterDoNotLoop(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "edge.cmds"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	broker := kc.ListenAddrs()[0]
	cfg, err := parseSources(t, fmt.Sprintf(`
streams:
  - {name: default, filters: ["#"]}
  - {name: cmds, filters: ["cmd/#"]}
sinks:
  - name: up
    streams: [cmds]
    backoff: {min: 50ms, max: 200ms}
    kafka: {brokers: ["%s"], topic: "edge.{stream}", key: "{topic}"}
sources:
  - name: down
    backoff: {min: 50ms, max: 200ms}
    kafka: {brokers: ["%s"], topics: [edge.cmds], topic: "cmd/down/{partition}"}
`, broker, strings.ToUpper(broker)))
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, cfg)
	publishQoS1(t, n.MQTTAddr(), "cmd/x", 10)
	st := n.Store().Stream("cmds")
	eventually(t, "10 records down again", func() bool { return st.Committed() >= 20 })
	time.Sleep(time.Second) // an echo would go round meanwhile
	if got := st.Committed(); got != 20 {
		t.Errorf("stream cmds holds %d records, want 20 (10 published, 10 brought down)", got)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics("edge.cmds"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	up := 0
	for ctx.Err() == nil {
		up += cl.PollFetches(ctx).NumRecords()
	}
	if up != 10 {
		t.Errorf("Kafka holds %d records, want the 10 published here", up)
	}
}
