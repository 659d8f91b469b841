package mqtt

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// deliveryWait bounds every wait in these tests. It only keeps a broken
// test from hanging: nothing asserts how long anything takes.
const deliveryWait = 20 * time.Second

// deliveryHarness is a mochi server on 127.0.0.1 with the allow-all hook, a
// minimal test-only ingest (captured publishes are appended to the memLog
// and not fanned out by mochi) and the delivery hook.
type deliveryHarness struct {
	log  *memLog
	srv  *mochi.Server
	d    *delivery
	m    *Metrics
	addr string
	once sync.Once
}

func newDeliveryHarness(tb testing.TB, cfg Config, specs ...string) *deliveryHarness {
	tb.Helper()
	h := &deliveryHarness{log: newMemLog(tb, specs...), m: NewMetrics(nil)}
	h.srv = mochi.New(&mochi.Options{
		Logger:       slog.New(slog.DiscardHandler),
		InlineClient: false,
	})
	if err := h.srv.AddHook(new(auth.AllowHook), nil); err != nil {
		tb.Fatal(err)
	}
	if err := h.srv.AddHook(&deliveryTestIngest{log: h.log}, nil); err != nil {
		tb.Fatal(err)
	}
	d, err := newDelivery(h.srv, h.log, cfg, h.m, slog.New(slog.DiscardHandler), nil, newGroups(), newSessions())
	if err != nil {
		tb.Fatal(err)
	}
	h.d = d
	if err := h.srv.AddHook(h.d, nil); err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	h.addr = ln.Addr().String()
	if err := h.srv.AddListener(listeners.NewNet("t1", ln)); err != nil {
		tb.Fatal(err)
	}
	if err := h.srv.Serve(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(h.close)
	return h
}

// close stops delivery first (it unblocks senders stuck on clients that do
// not read), then the clients, then mochi. mochi v2.7.9's Close takes the
// clients map's read lock twice (GetByListener -> Len): a client removing
// itself in between deadlocks it, so no client may still be leaving.
func (h *deliveryHarness) close() {
	h.once.Do(func() {
		h.d.Close()
		for _, cl := range h.srv.Clients.GetAll() {
			cl.Stop(packets.ErrServerShuttingDown)
		}
		deadline := time.Now().Add(deliveryWait)
		for h.srv.Clients.Len() > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		_ = h.srv.Close()
	})
}

// testDeliveryConfig is a Config with small queues, for tests.
func testDeliveryConfig() Config {
	cfg := DefaultConfig()
	cfg.Listen = ""
	return cfg
}

// appendRecs appends records to the named stream and waits until they are
// committed.
func (h *deliveryHarness) appendRecs(tb testing.TB, stream string, recs ...*logstore.Record) {
	tb.Helper()
	done := make(chan error, 1)
	h.log.stream(tb, stream).AppendAsync(recs, func(_ uint64, err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			tb.Fatalf("append: %v", err)
		}
	case <-time.After(deliveryWait):
		tb.Fatal("append: not committed")
	}
}

// appendN appends n records on topic with payloads "0".."n-1" in batches.
func (h *deliveryHarness) appendN(tb testing.TB, stream, topic string, qos byte, n int) {
	tb.Helper()
	const batch = 500
	for i := 0; i < n; i += batch {
		var recs []*logstore.Record
		for j := i; j < min(i+batch, n); j++ {
			recs = append(recs, &logstore.Record{Topic: topic, Payload: fmt.Appendf(nil, "%d", j), QoS: qos})
		}
		h.appendRecs(tb, stream, recs...)
	}
}

// deliveryTestIngest appends publishes to captured topics and tells mochi
// to acknowledge without fanning out, standing in for the real ingest hook.
type deliveryTestIngest struct {
	mochi.HookBase
	log *memLog
}

func (h *deliveryTestIngest) ID() string { return "test-ingest" }

func (h *deliveryTestIngest) Provides(b byte) bool { return b == mochi.OnPublish }

func (h *deliveryTestIngest) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	s := h.log.Route(pk.TopicName)
	if s == nil {
		return pk, nil
	}
	rec := &logstore.Record{
		Topic: pk.TopicName, Payload: pk.Payload, QoS: pk.FixedHeader.Qos,
		Retain: pk.FixedHeader.Retain, ClientID: cl.ID,
		ContentType: pk.Properties.ContentType, ResponseTopic: pk.Properties.ResponseTopic,
		CorrelationData: pk.Properties.CorrelationData,
	}
	for _, u := range pk.Properties.User {
		rec.UserProperties = append(rec.UserProperties, logstore.UserProperty{Key: u.Key, Value: u.Val})
	}
	if pk.Properties.PayloadFormatFlag {
		pf := pk.Properties.PayloadFormat
		rec.PayloadFormat = &pf
	}
	s.AppendAsync([]*logstore.Record{rec}, func(uint64, error) {})
	return pk, packets.CodeSuccessIgnore
}

// dropped returns Metrics.Dropped for reason.
func (h *deliveryHarness) dropped(reason string) float64 {
	return metricValue(h.m.Dropped.WithLabelValues(reason))
}

func (h *deliveryHarness) catchups() float64 { return metricValue(h.m.CursorCatchup) }

// dlvMsg is one message a paho client received.
type dlvMsg struct {
	topic   string
	payload string
	qos     byte
	retain  bool
}

// dlvPaho is a connected MQTT 3.1.1 paho client collecting what it gets.
type dlvPaho struct {
	c    paho.Client
	mu   sync.Mutex
	msgs []dlvMsg
	got  chan struct{} // 1-buffered: a message arrived
}

func dialDlvPaho(tb testing.TB, addr, id string) *dlvPaho {
	tb.Helper()
	p := &dlvPaho{got: make(chan struct{}, 1)}
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetAutoReconnect(false).SetConnectRetry(false).SetCleanSession(true).
		SetKeepAlive(60 * time.Second).SetOrderMatters(true).
		SetDefaultPublishHandler(p.handle) // one call per message, however many subscriptions match
	p.c = paho.NewClient(opts)
	if tok := p.c.Connect(); !tok.WaitTimeout(deliveryWait) || tok.Error() != nil {
		tb.Fatalf("paho connect %s: %v", id, tok.Error())
	}
	tb.Cleanup(func() { p.c.Disconnect(0) })
	return p
}

func (p *dlvPaho) handle(_ paho.Client, m paho.Message) {
	p.mu.Lock()
	p.msgs = append(p.msgs, dlvMsg{topic: m.Topic(), payload: string(m.Payload()), qos: m.Qos(), retain: m.Retained()})
	p.mu.Unlock()
	select {
	case p.got <- struct{}{}:
	default:
	}
}

func (p *dlvPaho) subscribe(tb testing.TB, filter string, qos byte) {
	tb.Helper()
	if tok := p.c.Subscribe(filter, qos, nil); !tok.WaitTimeout(deliveryWait) || tok.Error() != nil {
		tb.Fatalf("paho subscribe %s: %v", filter, tok.Error())
	}
}

func (p *dlvPaho) publish(tb testing.TB, topic string, qos byte, payload string) {
	tb.Helper()
	if tok := p.c.Publish(topic, qos, false, payload); !tok.WaitTimeout(deliveryWait) || tok.Error() != nil {
		tb.Fatalf("paho publish %s: %v", topic, tok.Error())
	}
}

// waitCount waits until at least n messages arrived and returns them.
func (p *dlvPaho) waitCount(tb testing.TB, n int) []dlvMsg {
	tb.Helper()
	var out []dlvMsg
	deadline := time.Now().Add(deliveryWait)
	for {
		p.mu.Lock()
		out = append([]dlvMsg(nil), p.msgs...)
		p.mu.Unlock()
		if len(out) >= n {
			return out
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %d messages; have %d", n, len(out))
		}
		select {
		case <-p.got:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (p *dlvPaho) received() []dlvMsg {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]dlvMsg(nil), p.msgs...)
}

// dialDlvRaw connects a packet-level client with clean session: it reads
// only when told to and acknowledges only when told to, so tests can be a
// slow subscriber or one that never acks. props are the v5 CONNECT
// properties.
func dialDlvRaw(tb testing.TB, addr, id string, version byte, props packets.Properties) *mqtttest.Raw {
	tb.Helper()
	return mqtttest.Dial(tb, addr, mqtttest.Connect{ClientID: id, Version: version, Clean: true, Properties: props})
}

// pingPublishes sends PINGREQ and reads until PINGRESP, returning the
// PUBLISHes read on the way (none are acknowledged).
func pingPublishes(tb testing.TB, c *mqtttest.Raw) []packets.Packet {
	tb.Helper()
	c.Ping()
	var pubs []packets.Packet
	for {
		pk := c.Read()
		switch pk.FixedHeader.Type {
		case packets.Pingresp:
			return pubs
		case packets.Publish:
			pubs = append(pubs, pk)
		}
	}
}
