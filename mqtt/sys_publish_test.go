package mqtt

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// TestIngest_PublishToSysIsAnswered: a QoS 1 or 2 publish to a $SYS topic
// gets an answer [MQTT-4.3.2-4]: MQTT 5, a PUBACK or PUBREC 0x90 with a
// reason string; MQTT 3.1.1, which has no refusal in PUBACK, a
// disconnect. mochi alone drops it without a word, and the client waits
// forever. Each is counted.
func TestIngest_PublishToSysIsAnswered(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) { c.Metrics = m })

	v5 := dialRaw(t, b, "v5", 5)
	v5.Publish("$SYS/broker/uptime", 1, 1, "0")
	if pk := expectPacket(t, v5, packets.Puback, packets.ErrTopicNameInvalid.Code); pk.PacketID != 1 || pk.Properties.ReasonString == "" {
		t.Fatalf("PUBACK for %d with reason %q, want 1 with a reason string", pk.PacketID, pk.Properties.ReasonString)
	}
	v5.Publish("$SYS/x", 2, 2, "0")
	if pk := expectPacket(t, v5, packets.Pubrec, packets.ErrTopicNameInvalid.Code); pk.PacketID != 2 {
		t.Fatalf("PUBREC for %d, want 2", pk.PacketID)
	}
	v5.Publish("$SYS/x", 0, 0, "0") // dropped and counted; the connection stays
	v5.Ping()
	v5.ReadUntil(packets.Pingresp)

	v3 := dialRaw(t, b, "v3", 4)
	v3.Publish("$SYS/x", 1, 3, "0")
	expectBareClose(t, v3)

	if got := metricValue(m.Refused.WithLabelValues(ReasonReadOnly)); got != 4 {
		t.Fatalf("refused{reserved_topic} = %v, want 4", got)
	}
}
