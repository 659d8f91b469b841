package mqtt

import (
	"log/slog"
	"strings"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// panicHook panics on the client's read goroutine when a PUBLISH to
// topic arrives, standing in for a bug in mochi or in a hook.
type panicHook struct {
	mochi.HookBase
	topic string
}

func (h *panicHook) ID() string { return "test-panic" }

func (h *panicHook) Provides(b byte) bool { return b == mochi.OnPacketRead }

func (h *panicHook) OnPacketRead(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Publish && pk.TopicName == h.topic {
		panic("boom: " + h.topic)
	}
	return pk, nil
}

// TestBroker_PanicClosesOnlyThatConnection: a panic while serving one
// client closes that client's connection, is counted and logged at ERROR
// with its stack, and every other client goes on; the panicking client's
// clean session is gone, as after any disconnect.
func TestBroker_PanicClosesOnlyThatConnection(t *testing.T) {
	rec := newLogRecorder(slog.LevelInfo)
	m := NewMetrics(nil)
	// "boom" is left to mochi, so ingest does not take it before the hook.
	b := newTestBroker(t, newMemLog(t, "news=news/#"), func(c *Config) {
		c.Metrics = m
		c.Logger = slog.New(rec)
	})
	if err := b.srv.AddHook(&panicHook{topic: "boom"}, nil); err != nil {
		t.Fatal(err)
	}
	bystander := dialRaw(t, b, "bystander", 5)
	bystander.Subscribe("news/#", 1)

	for i, version := range []byte{4, 5} {
		victim := dialRaw(t, b, "victim", version)
		victim.Subscribe("news/#", 1)
		victim.Publish("boom", 1, 1, "x")
		expectClosed(t, victim)
		// mochi's deferred Stop closes the socket while the panic unwinds,
		// before the listener's recover counts it.
		testwait.Eventually(t, "the panic to be counted", func() bool { return metricValue(m.Panics) == float64(i+1) })
		testwait.Eventually(t, "the victim's session to end", func() bool {
			_, ok := b.srv.Clients.Get("victim")
			return !ok
		})
	}
	lines := rec.find(func(l logLine) bool { return l.level == slog.LevelError && strings.Contains(l.attrs["panic"], "boom") })
	if len(lines) != 2 || !strings.Contains(lines[0].attrs["stack"], "OnPacketRead") || lines[0].attrs[attrClient] != "victim" {
		t.Fatalf("ERROR lines %+v, want two naming the client, the panic and its stack", lines)
	}

	pub := dialRaw(t, b, "pub", 5)
	pub.Publish("news/after", 1, 1, "still serving")
	expectPacket(t, pub, packets.Puback, 0)
	if pk := bystander.ReadUntil(packets.Publish); string(pk.Payload) != "still serving" {
		t.Fatalf("bystander got %q", pk.Payload)
	}
}

// sentPanicHook panics when a PUBLISH to topic has been sent: on the
// client's write goroutine for mochi's own deliveries.
type sentPanicHook struct {
	mochi.HookBase
	topic string
}

func (h *sentPanicHook) ID() string { return "test-sent-panic" }

func (h *sentPanicHook) writes(b byte) bool { return b == mochi.OnPacketSent }

func (h *sentPanicHook) OnPacketSent(_ *mochi.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type == packets.Publish && pk.TopicName == h.topic {
		panic("boom on the write goroutine")
	}
}

// rawSentHook provides OnPacketSent itself, outside any recover.
type rawSentHook struct{ sentPanicHook }

func (h *rawSentHook) Provides(b byte) bool { return b == mochi.OnPacketSent }

// TestBroker_RefusesAHookThatWritesUnrecovered: a hook that provides a
// write-goroutine event itself, where a panic would end the process, is
// refused.
func TestBroker_RefusesAHookThatWritesUnrecovered(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "news=news/#"))
	err := b.addHook(&rawSentHook{sentPanicHook{topic: "boom/out"}}, "test")
	if err == nil || !strings.Contains(err.Error(), "write goroutine") {
		t.Fatalf("addHook = %v, want a refusal naming the write goroutine", err)
	}
}

// TestBroker_PanicInAHookOnTheWriteGoroutine: a hook of Peat's that panics
// on mochi's write goroutine (a delivery of a topic no stream captures)
// closes that subscriber's connection only.
func TestBroker_PanicInAHookOnTheWriteGoroutine(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "news=news/#"), func(c *Config) { c.Metrics = m })
	if err := b.addHook(&sentPanicHook{topic: "boom/out"}, "test"); err != nil {
		t.Fatal(err)
	}
	victim := dialRaw(t, b, "victim", 4)
	victim.Subscribe("boom/#", 0)
	pub := dialRaw(t, b, "pub", 5)
	pub.Publish("boom/out", 0, 0, "x")
	expectClosed(t, victim)
	testwait.Eventually(t, "the panic to be counted", func() bool { return metricValue(m.Panics) == 1 })

	pub.Publish("news/after", 1, 1, "still serving")
	expectPacket(t, pub, packets.Puback, 0)
}
