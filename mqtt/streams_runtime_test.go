package mqtt

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// lastTopic returns the topic of the newest record of s.
func lastTopic(tb testing.TB, s *memStream) string {
	tb.Helper()
	recs := s.records()
	if len(recs) == 0 {
		tb.Fatalf("stream %s holds nothing", s.Name())
	}
	return recs[len(recs)-1].Topic
}

// publishAcked publishes a QoS 1 message from c and waits for its PUBACK:
// the record is then in the log.
func publishAcked(tb testing.TB, c interface {
	Publish(string, byte, uint16, string)
	ReadUntil(byte) packets.Packet
}, topic string, id uint16) {
	tb.Helper()
	c.Publish(topic, 1, id, "x")
	if ack := c.ReadUntil(packets.Puback); ack.ReasonCode >= 0x80 {
		tb.Fatalf("publish %s refused: 0x%02x", topic, ack.ReasonCode)
	}
}

// TestDelivery_StreamsChangeAtRunTime adds a stream that captures topics the
// default stream captured, then removes it: ingest routes by the streams of
// the moment, a live subscriber gets the records of both streams, $replay
// reads the added stream, and its removal stops that $replay and sends its
// topics back to the default stream.
func TestDelivery_StreamsChangeAtRunTime(t *testing.T) {
	l := newMemLog(t, "default=#")
	def := l.stream(t, "default")
	b := newTestBroker(t, l)
	pub := dialRaw(t, b, "pub", 5)
	sub := dialRaw(t, b, "sub", 5)
	sub.Subscribe("#", 1)

	publishAcked(t, pub, "sensors/a", 1)
	if got := lastTopic(t, def); got != "sensors/a" {
		t.Fatalf("before: default's last record is %q", got)
	}
	if pk := readPublishes(t, sub, 1)[0]; pk.TopicName != "sensors/a" {
		t.Fatalf("subscriber got %q, want sensors/a", pk.TopicName)
	}

	if _, err := l.ml.AddStream("sensors=sensors/#"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "delivery to read the added stream", func() bool { return b.deliv.reader("sensors") != nil })
	sensors := l.stream(t, "sensors")
	publishAcked(t, pub, "sensors/b", 2)
	if got := lastTopic(t, sensors); got != "sensors/b" || len(def.records()) != 1 {
		t.Fatalf("after add: sensors holds %q, default %d records", got, len(def.records()))
	}
	publishAcked(t, pub, "other", 3)
	got := readPublishes(t, sub, 2)
	seen := map[string]bool{got[0].TopicName: true, got[1].TopicName: true}
	if !seen["sensors/b"] || !seen["other"] {
		t.Fatalf("live subscriber got %q and %q, want sensors/b (added stream) and other (default)", got[0].TopicName, got[1].TopicName)
	}

	rep := dialRaw(t, b, "replay", 5)
	rep.Subscribe("$replay/earliest/+/sensors/#", 1)
	pk := readPublishes(t, rep, 1)[0]
	if pk.TopicName != "$replay/earliest/0/sensors/b" || userProp(pk.Properties, propStream) != "sensors" {
		t.Fatalf("$replay of the added stream: %q stream %q", pk.TopicName, userProp(pk.Properties, propStream))
	}
	testwait.Eventually(t, "the $replay tap to run", func() bool { return b.deliv.taps.Load() == 1 })

	if err := l.ml.RemoveStream("sensors"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "delivery to drop the removed stream", func() bool { return b.deliv.reader("sensors") == nil })
	testwait.Eventually(t, "the removed stream's $replay tap to stop", func() bool { return b.deliv.taps.Load() == 0 })
	publishAcked(t, pub, "sensors/c", 4)
	if got := lastTopic(t, def); got != "sensors/c" {
		t.Fatalf("after remove: default's last record is %q, want sensors/c", got)
	}
	if pk := readPublishes(t, sub, 1)[0]; pk.TopicName != "sensors/c" {
		t.Fatalf("subscriber got %q, want sensors/c", pk.TopicName)
	}
}

// A removed stream takes its consumer positions and its series with it: a
// stream added again under its name starts with neither.
func TestDelivery_RemovedStreamForgetsItsConsumers(t *testing.T) {
	l := newMemLog(t, "default=#", "sensors=sensors/#")
	sensors := l.stream(t, "sensors")
	store(t, sensors, topicsN("sensors", 0, 5), nil)
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "worker", 5)
	c.Subscribe("$group/g/+/sensors/#", 1)
	for _, pk := range readPublishes(t, c, 5) {
		c.Puback(pk.PacketID)
	}
	acksRead(t, c)
	testwait.Eventually(t, "the group's commit", func() bool { return storedGroupOffset(l, "g", "sensors") == "5" })
	d := dialDurable(t, b, 5)
	d.Subscribe("sensors/#", 1)
	testwait.Eventually(t, "the session's offset", func() bool {
		_, ok := b.deliv.sessions.offset("dur", cursorKey{stream: "sensors"})
		return ok
	})
	b.m.Delivered.WithLabelValues("sensors").Inc()

	if err := l.ml.RemoveStream("sensors"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "delivery to forget the removed stream's series", func() bool {
		return b.deliv.reader("sensors") == nil && testutil.CollectAndCount(b.m.Delivered) == 1 // default's
	})
	if _, ok := b.deliv.groups.position(groupKey{group: "g", stream: "sensors"}); ok {
		t.Error("the removed stream's group is still known")
	}
	if _, ok := b.deliv.sessions.offset("dur", cursorKey{stream: "sensors"}); ok {
		t.Error("the session still has an offset in the removed stream")
	}

	if _, err := l.ml.AddStream("sensors=sensors/#"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "delivery to read the added stream", func() bool { return b.deliv.reader("sensors") != nil })
	c.Unsubscribe("$group/g/+/sensors/#")
	if ack := c.Subscribe("$group/g/+/sensors/#", 1); userProp(ack.Properties, propStart) != "0" {
		t.Fatalf("the group in the re-added stream starts at %q, want 0 (the old offset 5 went with the old stream)",
			userProp(ack.Properties, propStart))
	}
}
