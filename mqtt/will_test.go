package mqtt

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// dialWill connects client id with will w.
func dialWill(tb testing.TB, b *Broker, id string, version byte, w *mqtttest.Will) *mqtttest.Raw {
	tb.Helper()
	c := rawConnect(id, version)
	c.Will = w
	return mqtttest.Dial(tb, b.Addr().String(), c)
}

// readWill reads the next PUBLISH sub gets and checks it is on topic.
func readWill(tb testing.TB, sub *mqtttest.Raw, topic string) packets.Packet {
	tb.Helper()
	pk := readPublishes(tb, sub, 1)[0]
	if pk.TopicName != topic {
		tb.Fatalf("got a PUBLISH on %q, want the will on %q", pk.TopicName, topic)
	}
	return pk
}

// MQTT 5 3.14.2.1: DISCONNECT with reason 0x04 (Disconnect with Will
// Message) closes the connection and the server publishes the will; so
// does any reason but 0x00 [MQTT-3.1.2-8]. A DISCONNECT of remaining
// length 1 carries the reason code alone (3.14.2.2.1: no properties), as
// some clients send it.
func TestWill_DisconnectWithWillMessagePublishesIt(t *testing.T) {
	cases := map[string][]byte{
		"0x04":                {0xe0, 0x02, 0x04, 0x00},
		"0x04 without props":  {0xe0, 0x01, 0x04},
		"0x80 (client error)": {0xe0, 0x02, 0x80, 0x00},
	}
	for _, spec := range []string{"default=#", "other=elsewhere/#"} { // captured, and mochi's
		for name, disconnect := range cases {
			t.Run(spec+"/"+name, func(t *testing.T) {
				b := newTestBroker(t, newMemLog(t, spec))
				sub := dialRaw(t, b, "sub", 5)
				sub.Subscribe("w/#", 1)
				c := dialWill(t, b, "leaver", 5, &mqtttest.Will{Topic: "w/leaver", Payload: []byte("bye"), Qos: 1})
				c.WriteBytes(disconnect)
				if pk := readWill(t, sub, "w/leaver"); string(pk.Payload) != "bye" {
					t.Fatalf("will payload %q, want bye", pk.Payload)
				}
			})
		}
	}
}

// A plain DISCONNECT (reason 0x00) discards the will [MQTT-3.1.2-10]: the
// next PUBLISH on the topic is the one stored after it.
func TestWill_NormalDisconnectDiscardsIt(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	sub := dialRaw(t, b, "sub", 5)
	sub.Subscribe("w/#", 1)
	c := dialWill(t, b, "leaver", 5, &mqtttest.Will{Topic: "w/leaver", Payload: []byte("bye"), Qos: 1})
	c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	testwait.Eventually(t, "the client to go", func() bool { return b.Clients() == 1 })
	expectNext(t, sub, s, "w/after")
}

// A will keeps the properties of the CONNECT's Will Properties and is
// published with them: Payload Format Indicator [MQTT-3.3.2-4], Response
// Topic [MQTT-3.3.2-15], Correlation Data [MQTT-3.3.2-16], Content Type
// [MQTT-3.3.2-20], Message Expiry Interval (3.1.3.2.4: sent as the
// publication's expiry) and User Properties [MQTT-3.3.2-17].
func TestWill_KeepsItsProperties(t *testing.T) {
	for _, spec := range []string{"default=#", "other=elsewhere/#"} { // captured, and mochi's
		t.Run(spec, func(t *testing.T) {
			b := newTestBroker(t, newMemLog(t, spec))
			sub := dialRaw(t, b, "sub", 5)
			sub.Subscribe("w/#", 1)
			w := &mqtttest.Will{Topic: "w/props", Payload: []byte(`{"gone":true}`), Qos: 1}
			w.Properties.PayloadFormat, w.Properties.PayloadFormatFlag = 1, true
			w.Properties.ResponseTopic = "w/reply"
			w.Properties.CorrelationData = []byte{0, 1, 2}
			w.Properties.ContentType = "application/json"
			w.Properties.MessageExpiryInterval = 3600
			w.Properties.User = []packets.UserProperty{{Key: "k", Val: "v"}}
			c := dialWill(t, b, "props", 5, w)
			c.Close() // no DISCONNECT: the will goes

			p := readWill(t, sub, "w/props").Properties
			checks := []struct {
				name string
				ok   bool
				got  any
			}{
				{"payload format", p.PayloadFormatFlag && p.PayloadFormat == 1, p.PayloadFormat},
				{"response topic", p.ResponseTopic == "w/reply", p.ResponseTopic},
				{"correlation data", bytes.Equal(p.CorrelationData, []byte{0, 1, 2}), p.CorrelationData},
				{"content type", p.ContentType == "application/json", p.ContentType},
				// what is left of 3600 s, counted from the publication
				{"message expiry", p.MessageExpiryInterval > 3500 && p.MessageExpiryInterval <= 3600, p.MessageExpiryInterval},
				{"user properties", userProp(p, "k") == "v", p.User},
			}
			for _, ch := range checks {
				if !ch.ok {
					t.Errorf("will %s: got %v", ch.name, ch.got)
				}
			}
		})
	}
}

// A will with an empty payload is valid (MQTT 3.1.3.4: the Will Payload
// may be zero length): the CONNECT is accepted, and the will is published
// with an empty payload.
func TestWill_EmptyPayload(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			b := newTestBroker(t, newMemLog(t, "default=#"))
			sub := dialRaw(t, b, "sub", version)
			sub.Subscribe("w/#", 1)
			c := dialWill(t, b, "empty", version, &mqtttest.Will{Topic: "w/empty", Qos: 1})
			c.Close()
			if pk := readWill(t, sub, "w/empty"); len(pk.Payload) != 0 {
				t.Fatalf("will payload %q, want empty", pk.Payload)
			}
		})
	}
}
