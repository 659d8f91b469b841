package mqtt

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// waitLimit only stops a broken test from hanging; no test asserts timing.
const waitLimit = 20 * time.Second // only stops a hang; generous for a loaded machine

// newTestBroker starts a broker on 127.0.0.1:0 over log, closed at cleanup.
func newTestBroker(tb testing.TB, log Log, mutate ...func(*Config)) *Broker {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Metrics = NewMetrics(nil)
	for _, f := range mutate {
		f(&cfg)
	}
	b, err := New(cfg, log)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	if err := b.Start(); err != nil {
		tb.Fatalf("Start: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			var stacks strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
			tb.Errorf("Close: %v\ngoroutines:\n%s", err, stacks.String())
		}
	})
	return b
}

// dialV3 connects an MQTT 3.1.1 paho client; lost receives the error when
// the broker drops the connection.
func dialV3(tb testing.TB, b *Broker, id string, opt ...func(*paho.ClientOptions)) (c paho.Client, lost <-chan error) {
	tb.Helper()
	lostCh := make(chan error, 1)
	o := paho.NewClientOptions().
		AddBroker("tcp://" + b.Addr().String()).
		SetClientID(id).
		SetProtocolVersion(4).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			select {
			case lostCh <- err:
			default:
			}
		})
	for _, f := range opt {
		f(o)
	}
	c = paho.NewClient(o)
	if t := c.Connect(); !t.WaitTimeout(waitLimit) || t.Error() != nil {
		tb.Fatalf("v3 connect %s: %v", id, t.Error())
	}
	tb.Cleanup(func() { c.Disconnect(0) })
	return c, lostCh
}

// dialV5 connects an MQTT 5 paho.golang client.
func dialV5(tb testing.TB, b *Broker, id string) (*pahov5.Client, *pahov5.Connack) {
	tb.Helper()
	conn, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	c := pahov5.NewClient(pahov5.ClientConfig{Conn: conn, ClientID: id, PacketTimeout: waitLimit})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ack, err := c.Connect(ctx, &pahov5.Connect{
		ClientID:   id,
		CleanStart: true,
		KeepAlive:  30,
		Properties: &pahov5.ConnectProperties{RequestProblemInfo: true},
	})
	if err != nil {
		tb.Fatalf("v5 connect %s: %v", id, err)
	}
	tb.Cleanup(func() { _ = c.Disconnect(&pahov5.Disconnect{}) })
	return c, ack
}

// dialRaw connects a packet-level client, for what paho hides (DUP
// resends, exact ack order, wire-level assertions), with protocol version 4
// (3.1.1) or 5.
func dialRaw(tb testing.TB, b *Broker, id string, version byte) *mqtttest.Raw {
	tb.Helper()
	return mqtttest.Dial(tb, b.Addr().String(), rawConnect(id, version))
}

// rawConnect is dialRaw's CONNECT, for tests that add to it (a will, say).
func rawConnect(id string, version byte) mqtttest.Connect {
	return mqtttest.Connect{ClientID: id, Version: version, Clean: true, Keepalive: 60}
}

// expectClosed reads until the broker closes c's connection; it fails on a
// PUBACK/PUBREC with a success code (a refused publish must not be acked).
func expectClosed(tb testing.TB, c *mqtttest.Raw) {
	tb.Helper()
	for {
		pk, err := c.Next()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				tb.Fatalf("connection still open after %v", mqtttest.ReadTimeout)
			}
			return
		}
		if (pk.FixedHeader.Type == packets.Puback || pk.FixedHeader.Type == packets.Pubrec) && pk.ReasonCode < 0x80 {
			tb.Fatalf("got a success %v for id %d before the disconnect", pk.FixedHeader.Type, pk.PacketID)
		}
	}
}

func TestBroker_NewValidates(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Window = 0
	cfg.MaxPayload = -1
	_, err := New(cfg, newMemLog(t, "default=#"))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with bad config: err %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"window", "max_payload"} {
		if !bytes.Contains([]byte(err.Error()), []byte(field)) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if _, err := New(DefaultConfig(), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with nil log: err %v, want ErrInvalidConfig", err)
	}
}

func TestBroker_AdvertisesLimits(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l, func(c *Config) { c.Window = 7; c.MaxPayload = 1000 })
	_, ack := dialV5(t, b, "caps")
	p := ack.Properties
	if p == nil || p.ReceiveMaximum == nil || *p.ReceiveMaximum != 7 {
		t.Errorf("CONNACK Receive Maximum = %v, want 7 (the window)", p.ReceiveMaximum)
	}
	if p == nil || p.MaximumPacketSize == nil || *p.MaximumPacketSize != maxPacketSize(1000) {
		t.Errorf("CONNACK Maximum Packet Size = %v, want %d", p.MaximumPacketSize, maxPacketSize(1000))
	}
	caps := b.Server().Options.Capabilities
	if caps.MaximumMessageExpiryInterval != 0 {
		t.Errorf("MaximumMessageExpiryInterval = %d, want 0 (mochi would delete retained messages)", caps.MaximumMessageExpiryInterval)
	}
	if got := b.Server().Options.ClientNetReadBufferSize; got != DefaultBufferSize {
		t.Errorf("read buffer = %d, want %d", got, DefaultBufferSize)
	}
}

func TestBroker_CountsClients(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	m := b.ingest.m
	c1, _ := dialV3(t, b, "one")
	c2, _ := dialV3(t, b, "two")
	for _, c := range []paho.Client{c1, c2} { // a round trip: the session is established
		if tok := c.Publish("sensors/x", 1, false, "x"); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	if got := b.Clients(); got != 2 {
		t.Errorf("Clients() = %d, want 2", got)
	}
	if got := metricValue(m.Connected); got != 2 {
		t.Errorf("connected gauge = %v, want 2", got)
	}
	c1.Disconnect(0)
	testwait.Eventually(t, "one client left", func() bool { return b.Clients() == 1 })
	testwait.Eventually(t, "gauge at 1", func() bool { return metricValue(m.Connected) == 1 })
}

func TestBroker_MalformedPacketDisconnectsOnlyThatClient(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	good, _ := dialV3(t, b, "good")
	bad := dialRaw(t, b, "bad", 4)
	// A PUBLISH whose topic length runs past the packet.
	bad.WriteBytes([]byte{0x30, 0x03, 0x00, 0x09, 'a'})
	expectClosed(t, bad)
	if tok := good.Publish("sensors/ok", 1, false, "still here"); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("other client's publish after the malformed one: %v", tok.Error())
	}
	recs := l.stream(t, "default").waitRecords(t, 1)
	if len(recs) != 1 || recs[0].Topic != "sensors/ok" {
		t.Fatalf("log = %v, want only sensors/ok", recs)
	}
}

func TestBroker_CloseUnblocksPublisherOnFullWindow(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	st.hold()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Window = 2
	b, err := New(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, b, "blocked", 4)
	for i := 1; i <= 4; i++ {
		c.Publish("sensors/x", 1, uint16(i), "x")
	}
	st.waitAppends(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("Close with a publisher blocked on its window: %v", err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := b.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
}

// hookCounter is a test hook counting mochi events ingest must avoid.
type hookCounter struct {
	mochi.HookBase
	willSent  atomic.Int64
	published atomic.Int64
}

func (h *hookCounter) ID() string { return "test-counter" }
func (h *hookCounter) Provides(b byte) bool {
	return b == mochi.OnWillSent || b == mochi.OnPublished
}
func (h *hookCounter) OnWillSent(*mochi.Client, packets.Packet)  { h.willSent.Add(1) }
func (h *hookCounter) OnPublished(*mochi.Client, packets.Packet) { h.published.Add(1) }

// metricValue reads a counter or gauge.
func metricValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
