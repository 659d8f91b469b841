package mqtt

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// An MQTT 3.1.1 client with an empty client id and Clean Session 0 is
// refused with return code 0x02, identifier rejected, and its connection
// closed [MQTT-3.1.3-8]; a return code above 5 is none of 3.1.1's
// [MQTT-3.2.2-6].
func TestConnect_V3EmptyClientIDWithoutCleanSession(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "default=#"))
	c := mqtttest.Handshake(t, dialTCP(t, b), mqtttest.Connect{Version: 4, Keepalive: 60})
	if ack := c.Connack; ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != packets.Err3ClientIdentifierNotValid.Code {
		t.Fatalf("got packet type %d return code %#x, want CONNACK 0x02", ack.FixedHeader.Type, ack.ReasonCode)
	}
	if ack := c.Connack; ack.SessionPresent {
		t.Error("refused CONNACK with Session Present 1")
	}
	expectClosed(t, c)
}
