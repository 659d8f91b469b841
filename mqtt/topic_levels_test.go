package mqtt

import (
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// levels is n levels of level, joined by '/'.
func levels(level string, n int) string {
	return strings.TrimSuffix(strings.Repeat(level+"/", n), "/")
}

// trySubscribeV5 subscribes raw to filter and returns the SUBACK.
func trySubscribeV5(tb testing.TB, raw *mqtttest.Raw, id uint16, filter string) packets.Packet {
	tb.Helper()
	raw.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    id,
		Filters:     packets.Subscriptions{{Filter: filter, Qos: 1}},
	})
	return raw.ReadUntil(packets.Suback)
}

// A filter deeper than max_topic_levels is refused in the SUBACK: MQTT 5
// 0x8F Topic Filter invalid with a reason string [MQTT-3.9.3-1], MQTT
// 3.1.1 0x80 [MQTT-3.9.3-2]; a 65,535-byte filter of 20,000 levels too,
// answered at once (BenchmarkSubscribeDeepFilter measures it). A filter
// of exactly max_topic_levels is granted. Each refusal is counted.
func TestTopicLevels_DeepFilterRefused(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "default=#"))
	v5 := dialRaw(t, b, "v5", 5)
	for i, f := range []string{levels("+", 20000), levels("a", 19999) + "/#", levels("a", DefaultMaxTopicLevels+1)} {
		ack := trySubscribeV5(t, v5, uint16(i+1), f)
		if len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != 0x8F || ack.Properties.ReasonString == "" {
			t.Fatalf("v5 subscribe to %d levels: codes %v reason %q, want 0x8F with a reason",
				strings.Count(f, "/")+1, ack.ReasonCodes, ack.Properties.ReasonString)
		}
	}
	if ack := trySubscribeV5(t, v5, 10, levels("+", DefaultMaxTopicLevels-1)+"/#"); ack.ReasonCodes[0] != 1 {
		t.Fatalf("v5 subscribe to max_topic_levels levels: code %#x, want granted", ack.ReasonCodes[0])
	}
	v3 := dialRaw(t, b, "v3", 4)
	if ack := v3.TrySubscribe(levels("+", 20000), 1); ack.ReasonCodes[0] != 0x80 {
		t.Fatalf("v3 subscribe to 20000 levels: code %#x, want 0x80", ack.ReasonCodes[0])
	}
	if got := metricValue(b.ingest.m.Denied.WithLabelValues(DeniedTopicLevels)); got != 4 {
		t.Errorf("topic_levels denied = %v, want 4", got)
	}
}

// A publish whose topic is deeper than max_topic_levels is refused and
// not stored: MQTT 5 QoS 1 gets PUBACK 0x90 Topic Name invalid with a
// reason string [MQTT-3.3.4-8 allows a reason code], QoS 0 is dropped,
// MQTT 3.1.1 is disconnected; on captured topics and the others alike.
// Each refusal is counted.
func TestTopicLevels_DeepTopicRefused(t *testing.T) {
	l := newMemLog(t, "default=a/#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	v5 := dialRaw(t, b, "v5", 5)
	for i, topic := range []string{levels("a", 20000), levels("a", DefaultMaxTopicLevels+1), levels("b", DefaultMaxTopicLevels+1)} {
		v5.Publish(topic, 0, 0, "qos0")
		v5.Publish(topic, 1, uint16(i+1), "qos1")
		pk := v5.ReadUntil(packets.Puback)
		if pk.PacketID != uint16(i+1) || pk.ReasonCode != 0x90 || pk.Properties.ReasonString == "" {
			t.Fatalf("v5 publish to %d levels: PUBACK %d reason %#x %q, want 0x90 with a reason",
				strings.Count(topic, "/")+1, pk.PacketID, pk.ReasonCode, pk.Properties.ReasonString)
		}
	}
	publishQoS1(t, v5, 10, levels("a", DefaultMaxTopicLevels), "fits", false)
	if n := st.submitted(); n != 1 {
		t.Fatalf("%d appends, want only the one of max_topic_levels levels", n)
	}
	v3 := dialRaw(t, b, "v3", 4)
	v3.Publish(levels("a", DefaultMaxTopicLevels+1), 1, 1, "x")
	expectClosed(t, v3)
	if got := metricValue(b.ingest.m.Refused.WithLabelValues(ReasonTopicLevels)); got != 7 {
		t.Errorf("topic_levels refused = %v, want 7", got)
	}
}
