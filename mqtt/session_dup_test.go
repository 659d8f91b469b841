package mqtt

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/internal/testwait"
)

// A QoS 1 message sent again to a resumed session carries DUP 1, and a
// message sent for the first time DUP 0 [MQTT-3.3.1-1] [MQTT-3.3.1-3]:
// records delivered from the log to a reconnecting session, and mochi's
// own resends of topics no stream captures.
func TestDurableSession_ResendsCarryDup(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d/from the log", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l)
			c := dialDurable(t, b, version)
			c.Subscribe("d/#", 1)
			store(t, s, topicsN("d", 0, 5), nil)
			for i := range 5 {
				pk := c.Read()
				if pk.FixedHeader.Dup {
					t.Fatalf("first delivery of %s has DUP 1", pk.TopicName)
				}
				if i < 2 {
					c.Puback(pk.PacketID)
				}
			}
			acksRead(t, c)
			leave(t, b, c)

			c = dialDurable(t, b, version)
			for i, pk := range readPublishes(t, c, 3) {
				if want := fmt.Sprintf("d/%d", 2+i); pk.TopicName != want || !pk.FixedHeader.Dup {
					t.Fatalf("resend %d: %s DUP %v, want %s with DUP 1", i, pk.TopicName, pk.FixedHeader.Dup, want)
				}
			}
			if pk := expectNext(t, c, s, "d/new"); pk.FixedHeader.Dup {
				t.Fatal("a record never sent before has DUP 1")
			}
		})
		t.Run(fmt.Sprintf("v%d/uncaptured", version), func(t *testing.T) {
			b := newTestBroker(t, newMemLog(t, "other=elsewhere/#"))
			c := dialDurable(t, b, version)
			c.Subscribe("d/#", 1)
			pub := dialRaw(t, b, "pub", version)
			pub.Publish("d/0", 1, 1, "x")
			pub.ReadUntil(packets.Puback)
			if pk := c.Read(); pk.TopicName != "d/0" || pk.FixedHeader.Dup {
				t.Fatalf("first delivery: %s DUP %v", pk.TopicName, pk.FixedHeader.Dup)
			}
			c.Close()
			testwait.Eventually(t, "the client to go", func() bool { return b.Clients() == 1 }) // pub stays
			c = dialDurable(t, b, version)
			if pk := c.Read(); pk.TopicName != "d/0" || !pk.FixedHeader.Dup {
				t.Fatalf("resend: %s DUP %v, want d/0 with DUP 1", pk.TopicName, pk.FixedHeader.Dup)
			}
		})
	}
}

// A connection that takes over a live one resends what that one was sent
// and did not acknowledge, with DUP 1 [MQTT-3.3.1-1].
func TestDurableSession_TakeoverResendsCarryDup(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	old := dialDurable(t, b, 5)
	old.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 0, 3), nil)
	for range 3 {
		old.Read() // not acknowledged
	}
	c := dialDurable(t, b, 5) // the same client id, while old is connected
	for i, pk := range readPublishes(t, c, 3) {
		if want := fmt.Sprintf("d/%d", i); pk.TopicName != want || !pk.FixedHeader.Dup {
			t.Fatalf("resend %d: %s DUP %v, want %s with DUP 1", i, pk.TopicName, pk.FixedHeader.Dup, want)
		}
	}
	if pk := expectNext(t, c, s, "d/new"); pk.FixedHeader.Dup {
		t.Fatal("a record never sent before has DUP 1")
	}
}
