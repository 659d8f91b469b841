package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/status"
)

// The issue's configuration, as written.
const issueSourceYAML = `
sources:
  - name: cloud
    mqtt:
      url: mqtt://cloud.example:1883
      client_id: site-a-down
      subscribe: [{filter: "site-a/cmd/#", qos: 1}]
      strip: "site-a/"          # then an optional topic: template, default "{topic}"
`

func TestParse_TheIssuesSourceExample(t *testing.T) {
	cfg, err := Parse([]byte(issueSourceYAML))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s := cfg.Sources[0]
	m := s.MQTT
	if s.Name != "cloud" || m.URL != "mqtt://cloud.example:1883" || m.ClientID != "site-a-down" || m.Strip != "site-a/" ||
		m.Topic != "{topic}" || m.Version != 5 || len(m.Subscribe) != 1 || m.Subscribe[0] != (SourceSubscription{"site-a/cmd/#", 1}) {
		t.Fatalf("parsed %+v %+v", s, m)
	}
	if st, err := cfg.sourceStream(s); err != nil || st != "default" {
		t.Fatalf("the source's stream: %q %v, want default", st, err)
	}
}

func TestValidate_SourceProblemsNameTheirField(t *testing.T) {
	for _, tc := range []struct{ yaml, path string }{
		{"sources:\n  - name: a\n", "sources[0]"},
		{"sources:\n  - name: a b\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: x}]}\n", "sources[0].name"},
		{"sources:\n  - name: a\n    mqtt: {url: http://h, client_id: c, subscribe: [{filter: x}]}\n", "sources[0].mqtt.url"},
		{"sources:\n  - name: a\n    mqtt: {url: mqtt://h, subscribe: [{filter: x}]}\n", "sources[0].mqtt.client_id"},
		{"sources:\n  - name: a\n    mqtt: {url: mqtt://h, client_id: c}\n", "sources[0].mqtt.subscribe"},
		{"sources:\n  - name: a\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: x, qos: 3}]}\n", "sources[0].mqtt.subscribe[0].qos"},
		{"sources:\n  - name: a\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: \"a/#/b\"}]}\n", "sources[0].mqtt.subscribe[0].filter"},
		{"sources:\n  - name: a\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: x}], topic: \"{stream}\"}\n", "sources[0].mqtt.topic"},
		{"sources:\n  - name: a\n    stream: nope\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: x}]}\n", "sources[0].stream"},
		// Two streams would take its topics: a source writes one.
		{"streams:\n  - {name: default, filters: [\"#\"]}\n  - {name: cmd, filters: [\"cmd/#\"]}\nsources:\n  - name: a\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: \"#\"}]}\n", "sources[0].stream"},
		{"sources:\n  - name: a\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: x}]}\n  - name: a\n    mqtt: {url: mqtt://h, client_id: d, subscribe: [{filter: x}]}\n", "sources[1].name"},
	} {
		cfg, err := Parse([]byte(tc.yaml))
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.path+":") {
			t.Errorf("%s\ngot %v, want a problem at %s", tc.yaml, err, tc.path)
		}
	}
	// The stream named must be the one that captures the topics.
	cfg, err := Parse([]byte("streams:\n  - {name: default, filters: [\"#\"]}\n  - {name: cmd, filters: [\"cmd/#\"]}\n" +
		"sources:\n  - name: a\n    stream: cmd\n    mqtt: {url: mqtt://h, client_id: c, subscribe: [{filter: \"up/cmd/#\"}], strip: up/}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a source naming the stream that captures its topics: %v", err)
	}
}

// sourceConfig is a node with the issue's source, pulling from addr.
func sourceConfig(t testing.TB, addr string) Config {
	t.Helper()
	cfg, err := Parse([]byte(strings.Replace(issueSourceYAML, "cloud.example:1883", addr, 1)))
	if err != nil {
		t.Fatal(err)
	}
	test := testConfig(t)
	test.Sources = cfg.Sources
	test.Sources[0].Backoff = BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(200 * time.Millisecond)}
	return test
}

func sourceStatuses(t testing.TB, n *Node) []source.Status {
	t.Helper()
	code, _, body := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/api/v1/sources")
	if code != http.StatusOK {
		t.Fatalf("GET /api/v1/sources: %d %s", code, body)
	}
	var out []source.Status
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("GET /api/v1/sources: %v: %s", err, body)
	}
	return out
}

// subscriber is an MQTT client that keeps what it gets.
type subscriber struct {
	mu  sync.Mutex
	got []paho.Message
}

func subscribe(t testing.TB, addr, id, filter string) *subscriber {
	t.Helper()
	s := &subscriber{}
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetAutoReconnect(false).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect to %v: %v", addr, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	tok := c.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) {
		s.mu.Lock()
		s.got = append(s.got, m)
		s.mu.Unlock()
	})
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	return s
}

func (s *subscriber) messages() []paho.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]paho.Message(nil), s.got...)
}

func publishTo(t testing.TB, addr, topic string, retain bool, payload string) {
	t.Helper()
	publishOne(t, addr, topic, 1, retain, payload)
}

func publishQoS(t testing.TB, addr, topic string, qos byte, payload string) {
	t.Helper()
	publishOne(t, addr, topic, qos, false, payload)
}

func publishOne(t testing.TB, addr, topic string, qos byte, retain bool, payload string) {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).
		SetClientID(fmt.Sprintf("cloud-app-%d", time.Now().UnixNano())).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect to %v: %v", addr, tok.Error())
	}
	defer c.Disconnect(0)
	if tok := c.Publish(topic, qos, retain, payload); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("publish to %s: %v", topic, tok.Error())
	}
}

// TestNode_SourceBringsCloudCommandsToLocalDevices: the issue's
// configuration as written; a command published in the cloud on
// site-a/cmd/dev1 reaches a device subscribed here as cmd/dev1, a
// retained one stays retained here, and the API, the metrics and
// pause/resume show and drive the source.
func TestNode_SourceBringsCloudCommandsToLocalDevices(t *testing.T) {
	cloud := sinktest.StartMosquitto(t)
	n := startNode(t, sourceConfig(t, cloud))
	base := "http://" + n.HTTPAddr().String()
	sinktest.WaitFor(t, "the source connected", 30*time.Second, func() bool {
		st := sourceStatuses(t, n)
		return len(st) == 1 && st[0].State == source.StateConnected
	})
	dev := subscribe(t, n.MQTTAddr().String(), "dev1", "cmd/#")
	publishTo(t, cloud, "site-a/cmd/dev1", false, "reboot")
	publishTo(t, cloud, "site-a/cmd/fw", true, "v2.1")
	sinktest.WaitFor(t, "the commands at the device", 30*time.Second, func() bool { return len(dev.messages()) == 2 })
	got := dev.messages()
	if got[0].Topic() != "cmd/dev1" || string(got[0].Payload()) != "reboot" || got[1].Topic() != "cmd/fw" || string(got[1].Payload()) != "v2.1" {
		t.Fatalf("device got %s %q, %s %q", got[0].Topic(), got[0].Payload(), got[1].Topic(), got[1].Payload())
	}
	// A device that subscribes later gets the retained firmware notice.
	late := subscribe(t, n.MQTTAddr().String(), "dev2", "cmd/fw")
	sinktest.WaitFor(t, "the retained message", 30*time.Second, func() bool { return len(late.messages()) == 1 })
	if m := late.messages()[0]; !m.Retained() || string(m.Payload()) != "v2.1" {
		t.Errorf("late device got %q retained=%v, want v2.1 retained", m.Payload(), m.Retained())
	}

	st := sourceStatuses(t, n)[0]
	if st.Name != "cloud" || st.Kind != "mqtt" || st.Stream != "default" || st.Received != 2 || st.LastReceived == nil {
		t.Errorf("GET /api/v1/sources = %+v", st)
	}
	for _, want := range []string{
		`peat_source_state{source="cloud",state="connected"} 1`,
		`peat_source_appended_records_total{source="cloud"} 2`,
		`peat_source_received_messages_total{source="cloud"} 2`,
	} {
		sinktest.WaitFor(t, "/metrics with "+want, 30*time.Second, func() bool {
			_, _, metrics := get(t, http.MethodGet, base+"/metrics")
			return strings.Contains(string(metrics), want)
		})
	}

	// The status document and page show it.
	_, _, doc := get(t, http.MethodGet, base+"/api/v1/status")
	var sd status.Status
	if err := json.Unmarshal(doc, &sd); err != nil || len(sd.Sources) != 1 || sd.Sources[0].Name != "cloud" ||
		sd.Sources[0].State != "connected" || sd.Sources[0].Received != 2 || sd.Sources[0].LastReceivedSeconds == nil {
		t.Errorf("GET /api/v1/status sources: %v %s", err, doc)
	}
	if _, _, page := get(t, http.MethodGet, base+"/"); !strings.Contains(string(page), `<tr data-source="cloud"><td>cloud</td><td>mqtt</td>`) {
		t.Errorf("the status page lacks the source:\n%s", page)
	}

	// Paused, the source is disconnected; the cloud keeps what comes.
	code, _, body := get(t, http.MethodPost, base+"/api/v1/sources/cloud/pause")
	if code != http.StatusOK || !strings.Contains(string(body), `"paused"`) {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, _, _ := get(t, http.MethodPost, base+"/api/v1/sources/nope/pause"); code != http.StatusNotFound {
		t.Errorf("pause of an unknown source: %d, want 404", code)
	}
	publishTo(t, cloud, "site-a/cmd/dev1", false, "while-paused")
	time.Sleep(300 * time.Millisecond)
	if k := len(dev.messages()); k != 2 {
		t.Fatalf("device got %d messages while the source was paused", k)
	}
	if code, _, _ := get(t, http.MethodPost, base+"/api/v1/sources/cloud/resume"); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	sinktest.WaitFor(t, "the message kept upstream", 30*time.Second, func() bool { return len(dev.messages()) == 3 })
}

// TestNode_SinkAndSourceOnOneUpstreamDoNotLoop: a sink sends every topic
// up as it is and a source brings every topic down as it is, on one
// broker. Without the marks each message would go round for ever: the
// sink skips the command that came down (peat-origin), and the source
// drops the local message that comes back down (peat-sink).
func TestNode_SinkAndSourceOnOneUpstreamDoNotLoop(t *testing.T) {
	cloud := sinktest.StartMosquitto(t)
	cfg := sinkConfig(t, cloud)
	cfg.Sinks[0].MQTT.Topic = "{topic}"
	cfg.Sinks[0].MQTT.ClientID = "site-a-up"
	src := sourceConfig(t, cloud).Sources[0]
	src.MQTT.Subscribe = []SourceSubscription{{Filter: "#", QoS: 1}}
	src.MQTT.Strip = ""
	cfg.Sources = []SourceConfig{src}
	n := startNode(t, cfg)
	up := sinktest.NewCollector(t, cloud, "#")
	local := subscribe(t, n.MQTTAddr().String(), "watcher", "#")
	sinktest.WaitFor(t, "the source connected", 30*time.Second, func() bool {
		st := sourceStatuses(t, n)
		return len(st) == 1 && st[0].State == source.StateConnected
	})

	publishQoS1(t, n.MQTTAddr(), "sensors/t", 1)     // up, and not down again
	publishTo(t, cloud, "cmd/dev1", false, "reboot") // down, and not up again
	sinktest.WaitFor(t, "both messages on both sides", 30*time.Second, func() bool {
		return len(up.Payloads()) >= 2 && len(local.messages()) >= 2
	})
	time.Sleep(time.Second) // a loop would have gone round many times by now
	if got := up.Topics(); len(got) != 2 {
		t.Errorf("upstream got %d messages %v, want 2 (each once)", len(got), got)
	}
	// Here: each once. The local publish comes back down marked with the
	// sink's client id (MQTT 5 user property peat-sink), and the source
	// drops it.
	var topics []string
	for _, m := range local.messages() {
		topics = append(topics, m.Topic())
	}
	if len(topics) != 2 {
		t.Errorf("local subscriber got %d messages %v..., want 2 (each once)", len(topics), topics[:min(6, len(topics))])
	}
	if st := sourceStatuses(t, n)[0]; st.Dropped != 1 || st.Appended != 1 {
		t.Errorf("source %+v: want the command stored and the echo dropped", st)
	}
	want := `peat_sink_echo_skipped_records_total{sink="cloud",stream="default"} 1`
	if _, _, metrics := get(t, http.MethodGet, "http://"+n.HTTPAddr().String()+"/metrics"); !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// The commented source example in configs/peat.yaml parses and validates
// once uncommented, with every field it documents.
func TestConfig_ExampleSourceIsValid(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "configs", "peat.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(data), "\n# sources:\n")
	if !ok {
		t.Fatal("configs/peat.yaml has no commented sources: example")
	}
	var b strings.Builder
	b.WriteString("sources:\n")
	for _, l := range strings.Split(example, "\n") {
		rest, ok := strings.CutPrefix(l, "# ")
		if !ok {
			break
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
	s := cfg.Sources[0]
	if s.Name != "cloud" || s.Stream != "default" || s.MQTT == nil || s.MQTT.ClientID != "site-a-down" ||
		len(s.MQTT.Subscribe) != 2 || s.MQTT.Subscribe[1].QoS != 2 || s.MQTT.ReceiveMax != 64 || s.StallAfter != Duration(time.Minute) {
		t.Fatalf("example parsed as %+v %+v", s, s.MQTT)
	}
}

// An mqtts:// cloud: the source checks the broker's certificate against
// tls.ca_file, and one it does not trust is a connection error it names.
func TestNode_SourceOverTLS(t *testing.T) {
	caFile, certFile, keyFile := sinktest.TLSFiles(t, t.TempDir())
	cloud, plain := sinktest.StartMosquittoTLS(t, certFile, keyFile)

	cfg := sourceConfig(t, cloud)
	cfg.Sources[0].MQTT.URL = "mqtts://" + cloud
	cfg.Sources[0].MQTT.TLS.CAFile = caFile
	n := startNode(t, cfg)
	sinktest.WaitFor(t, "the source connected over TLS", 30*time.Second, func() bool {
		return sourceStatuses(t, n)[0].State == source.StateConnected
	})
	dev := subscribe(t, n.MQTTAddr().String(), "dev1", "cmd/#")
	publishTo(t, plain, "site-a/cmd/dev1", false, "over-tls")
	sinktest.WaitFor(t, "the command over TLS", 30*time.Second, func() bool { return len(dev.messages()) == 1 })

	otherCA, _, _ := sinktest.TLSFiles(t, t.TempDir())
	cfg2 := sourceConfig(t, cloud)
	cfg2.Sources[0].MQTT.URL = "mqtts://" + cloud
	cfg2.Sources[0].MQTT.ClientID = "site-b-down"
	cfg2.Sources[0].MQTT.TLS.CAFile = otherCA
	n2 := startNode(t, cfg2)
	sinktest.WaitFor(t, "a TLS error in the status", time.Minute, func() bool {
		st := sourceStatuses(t, n2)
		return len(st) == 1 && strings.Contains(st[0].LastError, "certificate")
	})
	if st := sourceStatuses(t, n2)[0]; st.State != source.StateConnecting {
		t.Errorf("a source that cannot connect reports %s", st.State)
	}
}
