package mqtt

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// Peat supports no MQTT 5 enhanced authentication: a CONNECT that names
// an Authentication Method gets CONNACK 0x8C and is closed, counted, and
// never reaches the session it asked for [MQTT-4.12.0-1].
func TestGuard_RefusesAuthenticationMethod(t *testing.T) {
	m := NewMetrics(nil)
	b := newTestBroker(t, newMemLog(t, "default=#"), func(c *Config) { c.Metrics = m })

	c := rawConnect("scram", 5)
	c.Properties.AuthenticationMethod = "SCRAM-SHA-256"
	c.Properties.AuthenticationData = []byte("n,,n=user,r=nonce")
	r := mqtttest.Handshake(t, dialTCP(t, b), c)
	if ack := r.Connack; ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != packets.ErrBadAuthenticationMethod.Code {
		t.Fatalf("got packet type %d reason %#x, want CONNACK %#x", ack.FixedHeader.Type, ack.ReasonCode,
			packets.ErrBadAuthenticationMethod.Code)
	}
	if got := readUntilClosed(t, r.Conn()); len(got) != 0 {
		t.Fatalf("broker sent %x after the refusal", got)
	}
	if got := metricValue(m.Closed.WithLabelValues(ReasonBadAuthMethod)); got != 1 {
		t.Fatalf("closed{%s} = %v, want 1", ReasonBadAuthMethod, got)
	}
	if _, ok := b.Server().Clients.Get("scram"); ok {
		t.Fatal("the refused client was registered")
	}
	dialRaw(t, b, "plain", 5) // a CONNECT without one is served
}
