package mqtt

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
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

// A session's $replay subscription resends what an earlier connection was
// sent and did not acknowledge with DUP 1, as its plain subscriptions do
// [MQTT-3.3.1-1].
func TestDurableSession_ReplayResendsCarryDup(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			store(t, s, topicsN("d", 0, 5), nil)
			b := newTestBroker(t, l)
			c := dialDurable(t, b, version)
			c.Subscribe("$replay/0/+/d/#", 1)
			for i, pk := range readWithoutAck(t, c, 5) {
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
				if want := fmt.Sprintf("$replay/0/%d/d/%d", 2+i, 2+i); pk.TopicName != want || !pk.FixedHeader.Dup {
					t.Fatalf("resend %d: %s DUP %v, want %s with DUP 1", i, pk.TopicName, pk.FixedHeader.Dup, want)
				}
			}
			store(t, s, topicsN("d", 5, 6), nil)
			if pk := readPublishes(t, c, 1)[0]; pk.FixedHeader.Dup {
				t.Fatalf("%s, never sent before, has DUP 1", pk.TopicName)
			}
		})
	}
}

// The marks that say what a session was sent outlive the broker: after a
// restart, what the session was sent and did not acknowledge goes again
// with DUP 1 [MQTT-3.3.1-1], and they are in the stream's state while the
// client is still connected, so a kill -9 keeps them too.
func TestDurableSession_ResendsCarryDupAfterARestart(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l)
			c := dialDurable(t, b, version)
			c.Subscribe("d/#", 1)
			store(t, s, topicsN("d", 0, 3), nil)
			for _, pk := range readWithoutAck(t, c, 3) {
				if pk.FixedHeader.Dup {
					t.Fatalf("first delivery of %s has DUP 1", pk.TopicName)
				}
			}
			key := cursorKey{stream: "default"}.markRef("dur").key
			testwait.Eventually(t, "the resend mark in the stream's state", func() bool {
				v, ok := l.streamStateValue("default", key)
				return ok && len(v) == 8 && binary.BigEndian.Uint64(v) == 3 // after d/2
			})
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			if err := b.Close(ctx); err != nil {
				t.Fatal(err)
			}

			b = newTestBroker(t, l)
			c = dialDurable(t, b, version)
			for i, pk := range readPublishes(t, c, 3) {
				if want := fmt.Sprintf("d/%d", i); pk.TopicName != want || !pk.FixedHeader.Dup {
					t.Fatalf("resend %d after the restart: %s DUP %v, want %s with DUP 1", i, pk.TopicName, pk.FixedHeader.Dup, want)
				}
			}
			if pk := expectNext(t, c, s, "d/new"); pk.FixedHeader.Dup {
				t.Fatal("a record never sent before has DUP 1")
			}
		})
	}
}

// A session that ends takes its resend marks with it: a new session of
// the same client id gets DUP 0.
func TestDurableSession_CleanStartDropsResendMarks(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 0, 2), nil)
	readWithoutAck(t, c, 2)
	leave(t, b, c)
	key := cursorKey{stream: "default"}.markRef("dur").key
	testwait.Eventually(t, "the resend mark in the stream's state", func() bool {
		_, ok := l.streamStateValue("default", key)
		return ok
	})

	fresh := durableConnect("dur", 5)
	fresh.Clean = true
	c = mqtttest.Dial(t, b.Addr().String(), fresh)
	testwait.Eventually(t, "the resend mark to go with the session", func() bool {
		_, ok := l.streamStateValue("default", key)
		return !ok
	})
	c.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 2, 3), nil)
	if pk := readPublishes(t, c, 1)[0]; pk.FixedHeader.Dup {
		t.Fatalf("%s to a new session has DUP 1", pk.TopicName)
	}
}

// readWithoutAck reads n PUBLISHes from c, in order, and acknowledges
// none of them.
func readWithoutAck(tb testing.TB, c *mqtttest.Raw, n int) []packets.Packet {
	tb.Helper()
	var out []packets.Packet
	for len(out) < n {
		if pk := c.Read(); pk.FixedHeader.Type == packets.Publish {
			out = append(out, pk)
		}
	}
	return out
}
