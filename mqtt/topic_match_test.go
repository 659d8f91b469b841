package mqtt

import (
	"fmt"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// publishQoS1 publishes a QoS 1 message from c and waits for its PUBACK:
// once it returns, the broker has the message.
func publishQoS1(tb testing.TB, c *mqtttest.Raw, id uint16, topic, payload string, retain bool) {
	tb.Helper()
	c.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: retain},
		TopicName:   topic,
		PacketID:    id,
		Payload:     []byte(payload),
	})
	for {
		pk := c.ReadUntil(packets.Puback)
		if pk.PacketID != id {
			continue
		}
		if pk.ReasonCode >= 0x80 {
			tb.Fatalf("publish %s refused: %#x %s", topic, pk.ReasonCode, pk.Properties.ReasonString)
		}
		return
	}
}

// readPublish reads c's next PUBLISH, acknowledging it when QoS 1.
func readPublish(tb testing.TB, c *mqtttest.Raw) packets.Packet {
	tb.Helper()
	for {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if pk.FixedHeader.Qos == 1 {
			c.Puback(pk.PacketID)
		}
		return pk
	}
}

// '#' matches the parent level too, and '+' an empty level: a retained
// message on a/b reaches a new subscription to a/b/# or +/+/#
// [MQTT-4.7.1-2], as a live publish on a/b does, and so for the spec's
// sport/tennis/player1/# and for empty levels [MQTT-4.7.1-3]
// [MQTT-4.7.3-3]. Each subscriber then gets a live publish on the topic
// once, unflagged. The same whether a stream captures the topic or not
// (then mochi's index and retained store serve it: parentlevel.go).
func TestTopicMatch_RetainedAndLiveAgree(t *testing.T) {
	cases := []struct{ topic, filter string }{
		{"a/b", "a/b/#"},
		{"a/b", "+/+/#"},
		{"a/b", "a/+/#"},
		{"a", "+/#"},
		{"foo/x/baz", "foo/+/baz/#"},
		{"foo//baz", "foo//baz"},
		{"foo//baz", "foo/+/baz"},
		{"foo//baz", "foo/+/+/#"},
		{"sport/tennis/player1", "sport/tennis/player1/#"},
		{"sport", "sport/#"},
		{"/finance", "+/+"},
		{"/finance", "/+"},
	}
	for _, streams := range []string{"default=#", "elsewhere=elsewhere/#"} {
		for _, v := range []byte{4, 5} {
			for i, tc := range cases {
				t.Run(fmt.Sprintf("%s v%d %s on %s", streams, v, tc.filter, tc.topic), func(t *testing.T) {
					b := newTestBroker(t, newMemLog(t, streams))
					pub := dialRaw(t, b, "pub", v)
					payload := fmt.Sprintf("retained-%d", i)
					publishQoS1(t, pub, 1, tc.topic, payload, true)

					sub := dialRaw(t, b, "sub", v)
					sub.Subscribe(tc.filter, 1)
					got := readPublish(t, sub)
					if string(got.Payload) != payload || got.TopicName != tc.topic || !got.FixedHeader.Retain {
						t.Fatalf("new subscriber got %q on %q retain=%v, want %q on %q retained",
							got.Payload, got.TopicName, got.FixedHeader.Retain, payload, tc.topic)
					}
					publishQoS1(t, pub, 2, tc.topic, "live", false)
					got = readPublish(t, sub)
					if string(got.Payload) != "live" || got.FixedHeader.Retain {
						t.Fatalf("subscriber got %q retain=%v, want the live publish unflagged", got.Payload, got.FixedHeader.Retain)
					}
				})
			}
		}
	}
}

// A publish the broker received before a SUBSCRIBE is not a live message
// for it [MQTT-4.5.0-1] (the subscription's matching starts when it is
// made, 4.6.0 orders messages from then): a client that publishes a
// retained message, has its PUBACK, then subscribes gets it once, as a
// retained message, or, with Retain Handling 2, not at all (a message
// not retained: not at all); also when it
// had another subscription already (the shared reader may not have
// dispatched the publish yet when the SUBSCRIBE comes).
func TestTopicMatch_NoLiveCopyOfEarlierPublish(t *testing.T) {
	for _, tc := range []struct {
		name           string
		version        byte
		retainHandling byte
		retain         bool // the earlier publishes are retained
		wantRetained   bool
	}{
		{"v3", 4, 0, true, true},
		{"v3 not retained", 4, 0, false, false},
		{"v5 retain handling 0", 5, 0, true, true},
		{"v5 retain handling 0 not retained", 5, 0, false, false},
		{"v5 retain handling 2", 5, 2, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newMemLog(t, "default=#")
			b := newTestBroker(t, l)
			c := dialRaw(t, b, "c", tc.version)
			c.Subscribe("other/#", 1) // delivery already serves c
			// The shared reader is behind: it has not dispatched the
			// publishes when the SUBSCRIBE comes.
			resume := l.stream(t, "default").stallReads(t)
			for i := range 20 {
				publishQoS1(t, c, uint16(i+1), fmt.Sprintf("t/%d", i), "before", tc.retain)
			}
			c.Write(packets.Packet{
				FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
				PacketID:    100,
				Filters:     packets.Subscriptions{{Filter: "t/#", Qos: 1, RetainHandling: tc.retainHandling}},
			})
			c.ReadUntil(packets.Suback)
			resume()
			publishQoS1(t, c, 200, "t/end", "marker", false)
			var retained, live int
			for {
				pk := readPublish(t, c)
				if string(pk.Payload) == "marker" {
					break
				}
				if pk.FixedHeader.Retain {
					retained++
				} else {
					live++
					t.Errorf("live copy of %s, published before the SUBSCRIBE", pk.TopicName)
				}
			}
			want := 0
			if tc.wantRetained {
				want = 20
			}
			if retained != want || live != 0 {
				t.Fatalf("got %d retained and %d live copies of the 20 earlier publishes, want %d retained", retained, live, want)
			}
		})
	}
}

// Live publishes on a topic no stream captures reach every filter whose
// '#' matches the topic's parent level after '+' [MQTT-4.7.1-2], which
// mochi's index misses: each subscriber once (also one with an
// overlapping filter), one member of a shared group, a persistent
// session while offline (on its return), and no longer a client that
// unsubscribed.
func TestTopicMatch_LiveAtParentLevelWithoutStream(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "elsewhere=elsewhere/#"))
	plain := dialRaw(t, b, "plain", 5)
	plain.Subscribe("a/+/#", 1)
	both := dialRaw(t, b, "both", 4)
	both.Subscribe("a/+/#", 1)
	both.Subscribe("a/#", 1)
	g1, g2 := dialRaw(t, b, "g1", 5), dialRaw(t, b, "g2", 5)
	g1.Subscribe("$share/g/a/+/#", 1)
	g2.Subscribe("$share/g/a/+/#", 1)
	gone := dialRaw(t, b, "gone", 5)
	gone.Subscribe("a/+/#", 1)
	gone.Unsubscribe("a/+/#")
	away := mqtttest.Connect{ClientID: "away", Version: 4, Keepalive: 60}
	sess := mqtttest.Dial(t, b.Addr().String(), away)
	sess.Subscribe("+/+/#", 1)
	sess.Subscribe("marker", 1)
	sess.Close()
	online := []*mqtttest.Raw{plain, both, g1, g2, gone}
	for _, c := range online {
		c.Subscribe("marker", 1)
	}

	pub := dialRaw(t, b, "pub", 5)
	publishQoS1(t, pub, 1, "a/b", "m", false)
	publishQoS1(t, pub, 2, "marker", "end", false)

	copies := func(c *mqtttest.Raw) int {
		n := 0
		for {
			pk := readPublish(t, c)
			if pk.TopicName == "marker" {
				return n
			}
			if pk.TopicName == "a/b" {
				n++
			}
		}
	}
	got := map[string]int{}
	for i, c := range online {
		got[[]string{"plain", "both", "g1", "g2", "gone"}[i]] = copies(c)
	}
	if got["plain"] != 1 || got["both"] != 1 || got["g1"]+got["g2"] != 1 || got["gone"] != 0 {
		t.Errorf("copies of a/b: %v, want plain 1, both 1, one of g1 and g2, gone 0", got)
	}
	sess = mqtttest.Dial(t, b.Addr().String(), away)
	if !sess.Connack.SessionPresent {
		t.Fatal("the persistent session did not resume")
	}
	// mochi resends a session's messages in no set order: read both.
	seen := map[string]int{}
	for seen["a/b"] == 0 || seen["marker"] == 0 {
		seen[readPublish(t, sess).TopicName]++
	}
	sess.Ping()
	for {
		pk := sess.Read()
		if pk.FixedHeader.Type == packets.Pingresp {
			break
		}
		if pk.FixedHeader.Type == packets.Publish {
			seen[pk.TopicName]++
		}
	}
	if seen["a/b"] != 1 {
		t.Errorf("the persistent session got %d copies of a/b published while it was away, want 1", seen["a/b"])
	}
}

// slowFanout widens the window between mochi's ack of a QoS 1 publish on
// a topic no stream captures and its fan-out: OnQosComplete runs between
// the two.
type slowFanout struct{ mochi.HookBase }

func (slowFanout) ID() string                                  { return "slow-fanout" }
func (slowFanout) Provides(b byte) bool                        { return b == mochi.OnQosComplete }
func (slowFanout) OnQosComplete(*mochi.Client, packets.Packet) { time.Sleep(300 * time.Millisecond) }

// A publish on a topic no stream captures that the broker acknowledged
// before a SUBSCRIBE is no live message for it [MQTT-4.5.0-1]: mochi's
// fan-out comes after its PUBACK, so the PUBACK waits for it.
func TestTopicMatch_NoLiveCopyOfEarlierPublishWithoutStream(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "elsewhere=elsewhere/#"))
	if err := b.srv.AddHook(&slowFanout{}, nil); err != nil {
		t.Fatal(err)
	}
	pub := dialRaw(t, b, "pub", 5)
	sub := dialRaw(t, b, "sub", 5)
	publishQoS1(t, pub, 1, "t/1", "before", false)
	sub.Subscribe("t/#", 1)
	publishQoS1(t, pub, 2, "t/end", "marker", false)
	for {
		pk := readPublish(t, sub)
		if string(pk.Payload) == "marker" {
			return
		}
		t.Errorf("the subscriber got %q on %s, published and acknowledged before it subscribed", pk.Payload, pk.TopicName)
	}
}
