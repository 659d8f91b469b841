package mqtt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

func TestIngest_AppendsPublishesWithProperties(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	c, _ := dialV5(t, b, "producer")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	pf := byte(1)
	for qos := byte(0); qos <= 2; qos++ {
		_, err := c.Publish(ctx, &pahov5.Publish{
			QoS:     qos,
			Topic:   fmt.Sprintf("sensors/q%d", qos),
			Payload: []byte(fmt.Sprintf("payload %d", qos)),
			Properties: &pahov5.PublishProperties{
				ContentType:     "text/plain",
				ResponseTopic:   "replies/x",
				CorrelationData: []byte{1, 2, qos},
				PayloadFormat:   &pf,
				User:            pahov5.UserProperties{{Key: "k", Value: "v1"}, {Key: "k", Value: "v2"}},
			},
		})
		if err != nil {
			t.Fatalf("publish QoS %d: %v", qos, err)
		}
	}
	recs := st.waitRecords(t, 3)
	for i, r := range recs {
		qos := byte(i)
		if r.Topic != fmt.Sprintf("sensors/q%d", qos) || string(r.Payload) != fmt.Sprintf("payload %d", qos) || r.QoS != qos {
			t.Errorf("record %d: topic %q payload %q qos %d", i, r.Topic, r.Payload, r.QoS)
		}
		if r.ClientID != "producer" || r.ContentType != "text/plain" || r.ResponseTopic != "replies/x" ||
			string(r.CorrelationData) != string([]byte{1, 2, qos}) || r.PayloadFormat == nil || *r.PayloadFormat != 1 {
			t.Errorf("record %d lost properties: %+v", i, r)
		}
		want := []logstore.UserProperty{{Key: "k", Value: "v1"}, {Key: "k", Value: "v2"}}
		if fmt.Sprint(r.UserProperties) != fmt.Sprint(want) {
			t.Errorf("record %d user properties %v, want %v", i, r.UserProperties, want)
		}
	}
	if got := metricValue(b.ingest.m.Received.WithLabelValues("default")); got != 3 {
		t.Errorf("received metric = %v, want 3", got)
	}
}

func TestIngest_AckOnlyWhenDurable(t *testing.T) {
	for _, v := range []byte{4, 5} {
		for _, qos := range []byte{1, 2} {
			t.Run(fmt.Sprintf("v%d/qos%d", v, qos), func(t *testing.T) {
				l := newMemLog(t, "default=#")
				st := l.stream(t, "default")
				b := newTestBroker(t, l)
				c := dialRaw(t, b, "p", v)
				st.hold()
				c.Publish("sensors/a", qos, 1, "x")
				st.waitAppends(t, 1)
				c.Ping() // answered by the read goroutine, which already handed the publish over
				if pk := c.Read(); pk.FixedHeader.Type != packets.Pingresp {
					t.Fatalf("before the append is durable got %v id %d, want only PINGRESP", pk.FixedHeader.Type, pk.PacketID)
				}
				st.release()
				want := byte(packets.Puback)
				if qos == 2 {
					want = packets.Pubrec
				}
				if pk := c.Read(); pk.FixedHeader.Type != want || pk.PacketID != 1 || pk.ReasonCode != 0 {
					t.Fatalf("after the append: got %v id %d reason %#x, want %v id 1", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, want)
				}
				if qos == 2 {
					c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: 1})
					if pk := c.Read(); pk.FixedHeader.Type != packets.Pubcomp || pk.PacketID != 1 || pk.ReasonCode != 0 {
						t.Fatalf("PUBREL answered with %v id %d reason %#x, want PUBCOMP success", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
					}
				}
			})
		}
	}
}

func TestIngest_AcksInArrivalOrder(t *testing.T) {
	l := newMemLog(t, "a=a/#", "b=b/#")
	sa, sb := l.stream(t, "a"), l.stream(t, "b")
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "p", 5)
	sa.hold() // stream a is slow: b's appends complete first
	const n = 20
	for i := 1; i <= n; i++ {
		topic := "a/x"
		if i%2 == 0 {
			topic = "b/x"
		}
		c.Publish(topic, 1+byte(i%2), uint16(i), fmt.Sprint(i))
	}
	// All of them are in flight at once: nothing waits for an earlier fsync.
	sa.waitAppends(t, n/2)
	sb.waitRecords(t, n/2)
	c.Ping()
	if pk := c.Read(); pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("got %v id %d while the first publish is not durable, want PINGRESP", pk.FixedHeader.Type, pk.PacketID)
	}
	sa.release()
	for i := 1; i <= n; i++ {
		pk := c.Read()
		if pk.PacketID != uint16(i) || pk.ReasonCode != 0 {
			t.Fatalf("ack %d: got %v id %d reason %#x", i, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
		}
	}
}

func TestIngest_WindowBoundsPendingPublishes(t *testing.T) {
	const window, n = 4, 10
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l, func(c *Config) { c.Window = window })
	c := dialRaw(t, b, "p", 4)
	st.hold()
	for i := 1; i <= n; i++ {
		c.Publish("sensors/x", 1, uint16(i), "x")
	}
	c.Ping()
	st.waitAppends(t, window)
	if got := st.submitted(); got != window {
		t.Fatalf("%d appends pending with a window of %d", got, window)
	}
	st.release()
	// The read goroutine was blocked on the full window, so the PINGREQ
	// behind publish n was read only after publish n got a slot, which
	// the ack of publish n-window freed.
	var seq []string
	for len(seq) < n+1 {
		pk := c.Read()
		if pk.FixedHeader.Type == packets.Pingresp {
			seq = append(seq, "ping")
		} else {
			seq = append(seq, fmt.Sprint(pk.PacketID))
		}
	}
	pingAt := -1
	for i, s := range seq {
		if s == "ping" {
			pingAt = i
		}
	}
	if pingAt < n-window {
		t.Fatalf("wire order %v: PINGRESP before ack %d, so publishes went past the window", seq, n-window)
	}
	for i, want := 0, 1; i < len(seq); i++ {
		if seq[i] == "ping" {
			continue
		}
		if seq[i] != fmt.Sprint(want) {
			t.Fatalf("wire order %v: acks out of order", seq)
		}
		want++
	}
	if got := len(st.records()); got != n {
		t.Fatalf("%d records, want %d", got, n)
	}
}

func TestIngest_QoS2ResendAppendedOnce(t *testing.T) {
	for _, v := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			st := l.stream(t, "default")
			b := newTestBroker(t, l)
			c := dialRaw(t, b, "p", v)
			resend := func() { // the same message again, DUP set
				t.Helper()
				c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2, Dup: true},
					TopicName: "sensors/q2", PacketID: 7, Payload: []byte("once")})
			}
			st.hold()
			c.Publish("sensors/q2", 2, 7, "once")
			st.waitAppends(t, 1)
			resend() // resent before PUBREC
			c.Ping()
			if pk := c.Read(); pk.FixedHeader.Type != packets.Pingresp {
				t.Fatalf("resend answered with %v reason %#x before the original is durable", pk.FixedHeader.Type, pk.ReasonCode)
			}
			st.release()
			for i := 0; i < 2; i++ {
				if pk := c.Read(); pk.FixedHeader.Type != packets.Pubrec || pk.PacketID != 7 || pk.ReasonCode != 0 {
					t.Fatalf("answer %d: %v id %d reason %#x, want PUBREC 7 success", i, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
				}
			}
			resend() // resent after PUBREC, before PUBREL
			if pk := c.Read(); pk.FixedHeader.Type != packets.Pubrec || pk.PacketID != 7 || pk.ReasonCode != 0 {
				t.Fatalf("late resend: %v id %d reason %#x, want PUBREC 7 success", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
			}
			c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: 7})
			if pk := c.Read(); pk.FixedHeader.Type != packets.Pubcomp || pk.PacketID != 7 || pk.ReasonCode != 0 {
				t.Fatalf("PUBREL: %v id %d reason %#x, want PUBCOMP 7 success", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
			}
			// The id is free again: a new message with it is a new message.
			c.Publish("sensors/q2", 2, 7, "second")
			if pk := c.Read(); pk.FixedHeader.Type != packets.Pubrec || pk.PacketID != 7 {
				t.Fatalf("new publish with a released id: %v id %d", pk.FixedHeader.Type, pk.PacketID)
			}
			recs := st.records()
			if len(recs) != 2 || string(recs[0].Payload) != "once" || string(recs[1].Payload) != "second" {
				t.Fatalf("log holds %d records %v, want once, second", len(recs), recs)
			}
			if st.submitted() != 2 {
				t.Fatalf("%d appends, want 2", st.submitted())
			}
		})
	}
}

func TestIngest_WillAppendedOnAbnormalDisconnect(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	counter := new(hookCounter)
	if err := b.Server().AddHook(counter, nil); err != nil {
		t.Fatal(err)
	}
	dialWithWill := func(id, topic, payload string) *mqtttest.Raw {
		c := rawConnect(id, 4)
		c.Will = &mqtttest.Will{Topic: topic, Payload: []byte(payload), Qos: 1, Retain: true}
		return mqtttest.Dial(t, b.Addr().String(), c)
	}

	polite := dialWithWill("polite", "sensors/polite/status", "gone")
	polite.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	testwait.Eventually(t, "polite client gone", func() bool { return b.Clients() == 0 })

	dying := dialWithWill("dying", "sensors/dying/status", "offline")
	dying.Close() // no DISCONNECT
	recs := st.waitRecords(t, 1)
	r := recs[0]
	if r.Topic != "sensors/dying/status" || string(r.Payload) != "offline" || r.QoS != 1 || !r.Retain || r.ClientID != "dying" {
		t.Fatalf("will record %+v", r)
	}
	testwait.Eventually(t, "dying client gone", func() bool { return b.Clients() == 0 })
	if n := st.submitted(); n != 1 {
		t.Fatalf("%d appends: the will of a client that sent DISCONNECT was appended too", n)
	}
	if n := counter.willSent.Load(); n != 0 {
		t.Fatalf("mochi sent %d wills itself: captured wills must reach subscribers only through the log", n)
	}
	testwait.Eventually(t, "retained will", func() bool {
		m := retainedPayloads(b, "sensors/dying/status")
		return len(m) == 1 && m[0] == "offline"
	})
}

func TestIngest_RefusesWhenAppendFails(t *testing.T) {
	cases := []struct {
		name     string
		err      error
		wantCode byte
	}{
		{"disk full", logstore.ErrNoSpace, 0x97},
		{"other", errors.New("boom"), 0x80},
	}
	for _, tc := range cases {
		for _, qos := range []byte{1, 2} {
			t.Run(fmt.Sprintf("v5/%s/qos%d", tc.name, qos), func(t *testing.T) {
				l := newMemLog(t, "default=#")
				st := l.stream(t, "default")
				b := newTestBroker(t, l)
				c := dialRaw(t, b, "p", 5)
				cl, _ := b.Server().Clients.Get("p")
				st.fail(tc.err)
				c.Publish("sensors/a", qos, 3, "x")
				pk := c.Read()
				if pk.PacketID != 3 || pk.ReasonCode != tc.wantCode || pk.Properties.ReasonString == "" {
					t.Fatalf("got %v id %d reason %#x %q, want reason %#x with a reason string",
						pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, pk.Properties.ReasonString, tc.wantCode)
				}
				if _, ok := cl.State.Inflight.Get(3); ok {
					t.Fatalf("refused QoS %d publish left id 3 in the client's inflight", qos)
				}
				if got := metricValue(b.ingest.m.Refused.WithLabelValues(ReasonStoreFailed)); got != 1 {
					t.Errorf("refused metric = %v, want 1", got)
				}
				st.fail(nil) // space is back: publishing works again
				c.Publish("sensors/a", 1, 4, "y")
				if pk := c.Read(); pk.PacketID != 4 || pk.ReasonCode != 0 {
					t.Fatalf("after healing: %v id %d reason %#x", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
				}
			})
		}
	}
	t.Run("v3 is disconnected", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		b := newTestBroker(t, l)
		c := dialRaw(t, b, "p", 4)
		st.fail(logstore.ErrNoSpace)
		c.Publish("sensors/a", 1, 3, "x")
		expectClosed(t, c)
	})
	t.Run("v3 paho sees the connection lost", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		b := newTestBroker(t, l)
		c, lost := dialV3(t, b, "p")
		st.fail(logstore.ErrNoSpace)
		c.Publish("sensors/a", 1, false, "x")
		if err := waitErr(lost); err == nil {
			t.Fatal("client not disconnected after a refused publish")
		}
	})
}

func waitErr(ch <-chan error) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return nil
	}
}

func TestIngest_RefusesOversizePayload(t *testing.T) {
	const max = 16
	big := strings.Repeat("x", max+1)
	t.Run("v5", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		st := l.stream(t, "default")
		b := newTestBroker(t, l, func(c *Config) { c.MaxPayload = max })
		c := dialRaw(t, b, "p", 5)
		c.Publish("sensors/a", 0, 0, big) // dropped and counted
		c.Publish("sensors/a", 1, 1, big)
		pk := c.Read()
		if pk.PacketID != 1 || pk.ReasonCode != 0x97 || !strings.Contains(pk.Properties.ReasonString, "max_payload") {
			t.Fatalf("oversize publish: %v id %d reason %#x %q", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, pk.Properties.ReasonString)
		}
		c.Publish("sensors/a", 1, 2, strings.Repeat("x", max))
		if pk := c.Read(); pk.PacketID != 2 || pk.ReasonCode != 0 {
			t.Fatalf("publish at the limit: %v id %d reason %#x", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
		}
		if recs := st.records(); len(recs) != 1 || len(recs[0].Payload) != max {
			t.Fatalf("log holds %d records, want only the one at the limit", len(recs))
		}
		if got := metricValue(b.ingest.m.Refused.WithLabelValues(ReasonTooLarge)); got != 2 {
			t.Errorf("too_large refused = %v, want 2 (QoS 0 and QoS 1)", got)
		}
	})
	t.Run("v3", func(t *testing.T) {
		l := newMemLog(t, "default=#")
		b := newTestBroker(t, l, func(c *Config) { c.MaxPayload = max })
		c := dialRaw(t, b, "p", 4)
		c.Publish("sensors/a", 1, 1, big)
		expectClosed(t, c)
		if n := l.stream(t, "default").submitted(); n != 0 {
			t.Fatalf("%d appends of an oversize payload", n)
		}
	})
}

func TestIngest_RefusesReservedTopics(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	v5 := dialRaw(t, b, "v5", 5)
	for i, topic := range []string{"$replay/0/5/sensors/a", "$group/g/5/x"} {
		v5.Publish(topic, 1, uint16(i+1), "x")
		if pk := v5.Read(); pk.PacketID != uint16(i+1) || pk.ReasonCode != 0x90 {
			t.Fatalf("publish to %s: %v reason %#x, want 0x90", topic, pk.FixedHeader.Type, pk.ReasonCode)
		}
	}
	v3 := dialRaw(t, b, "v3", 4)
	v3.Publish("$replay/x", 1, 1, "x")
	expectClosed(t, v3)
	if n := st.submitted(); n != 0 {
		t.Fatalf("%d appends for reserved topics", n)
	}
	if got := metricValue(b.ingest.m.Refused.WithLabelValues(ReasonReadOnly)); got != 3 {
		t.Errorf("reserved_topic refused = %v, want 3", got)
	}
}

func TestIngest_UncapturedTopicsGoThroughMochi(t *testing.T) {
	l := newMemLog(t, "a=sensors/#")
	st := l.stream(t, "a")
	b := newTestBroker(t, l)
	sub, _ := dialV3(t, b, "sub")
	got := make(chan paho.Message, 1)
	if tok := sub.Subscribe("other/#", 1, func(_ paho.Client, m paho.Message) { got <- m }); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	pub, _ := dialV3(t, b, "pub")
	if tok := pub.Publish("other/x", 1, false, "via mochi"); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	select {
	case m := <-got:
		if m.Topic() != "other/x" || string(m.Payload()) != "via mochi" {
			t.Fatalf("got %s %q", m.Topic(), m.Payload())
		}
	case <-ctx.Done():
		t.Fatal("subscriber of an uncaptured topic got nothing")
	}
	if n := st.submitted(); n != 0 {
		t.Fatalf("an uncaptured topic was appended %d times", n)
	}
}

// Ingest takes most publishes over as they are read (OnPacketRead), but
// leaves those mochi must judge to mochi. A publish the ACL refuses is
// refused as mochi refuses it, and not stored, at every QoS and version.
func TestIngest_ACLRefusedPublishNotStored(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l, func(c *Config) {
		c.Auth = &testAuth{rules: []testRule{
			{filter: "sensors/secret/#", write: true, allow: false},
			{filter: "#", read: true, write: true, allow: true},
		}}
	})
	v5 := dialRaw(t, b, "p5", 5)
	v5.Publish("sensors/secret/a", 0, 0, "refused, silently")
	v5.Publish("sensors/secret/a", 1, 1, "refused")
	if ack := v5.ReadUntil(packets.Puback); ack.PacketID != 1 || ack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Errorf("refused QoS 1 publish: PUBACK id %d reason %#x, want id 1 reason 0x87", ack.PacketID, ack.ReasonCode)
	}
	v5.Publish("sensors/open/a", 1, 2, "stored")
	if ack := v5.ReadUntil(packets.Puback); ack.PacketID != 2 || ack.ReasonCode != 0 {
		t.Errorf("allowed publish: PUBACK id %d reason %#x, want id 2 reason 0", ack.PacketID, ack.ReasonCode)
	}
	v3 := dialRaw(t, b, "p3", 4)
	v3.Publish("sensors/secret/b", 1, 1, "refused")
	expectClosed(t, v3) // MQTT 3 has no negative PUBACK: mochi disconnects
	recs := st.records()
	if len(recs) != 1 || recs[0].Topic != "sensors/open/a" {
		t.Fatalf("stored %d records (%v), want only sensors/open/a", len(recs), recs)
	}
}

// A publish with an MQTT 5 topic alias is left to mochi, which resolves
// the alias: the record carries the topic, also when the publish carries
// only the alias.
func TestIngest_TopicAliasResolvedBeforeAppend(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "aliased", 5)
	alias := packets.Properties{TopicAlias: 1, TopicAliasFlag: true}
	c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName: "sensors/long/topic/name", PacketID: 1, Payload: []byte("first"), Properties: alias})
	c.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID: 2, Payload: []byte("second"), Properties: alias})
	for id := uint16(1); id <= 2; id++ {
		if ack := c.ReadUntil(packets.Puback); ack.PacketID != id || ack.ReasonCode != 0 {
			t.Fatalf("PUBACK id %d reason %#x, want id %d reason 0", ack.PacketID, ack.ReasonCode, id)
		}
	}
	for i, r := range st.waitRecords(t, 2) {
		if r.Topic != "sensors/long/topic/name" {
			t.Errorf("record %d (%q): topic %q, want the alias's sensors/long/topic/name", i, r.Payload, r.Topic)
		}
	}
}

// A publish on a captured topic reaches a subscriber once, from the log:
// mochi must not deliver it as well, at any QoS.
func TestIngest_CapturedPublishDeliveredOnce(t *testing.T) {
	l := newMemLog(t, "a=sensors/#")
	b := newTestBroker(t, l)
	sub, _ := dialV3(t, b, "sub")
	var mu sync.Mutex
	counts := map[string]int{}
	end := make(chan struct{})
	if tok := sub.Subscribe("sensors/#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		defer mu.Unlock()
		counts[string(m.Payload())]++
		if string(m.Payload()) == "end" {
			close(end)
		}
	}); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	pub, _ := dialV3(t, b, "pub")
	var sent []string
	for i := range 20 {
		qos := byte(i % 2)
		payload := fmt.Sprintf("qos%d-%d", qos, i)
		if tok := pub.Publish("sensors/x", qos, false, payload); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
		sent = append(sent, payload)
	}
	if tok := pub.Publish("sensors/x", 1, false, "end"); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case <-end:
	case <-time.After(waitLimit):
		t.Fatal("the subscriber never got the last message")
	}
	time.Sleep(100 * time.Millisecond) // a second copy would have come by now
	mu.Lock()
	defer mu.Unlock()
	for _, p := range sent {
		if counts[p] != 1 {
			t.Errorf("%s delivered %d times, want once", p, counts[p])
		}
	}
}

func TestIngest_RetainedOnCapturedTopic(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	pub, _ := dialV3(t, b, "pub")
	publish := func(payload string) {
		t.Helper()
		if tok := pub.Publish("sensors/r", 1, true, payload); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	retained := func() []string { return retainedPayloads(b, "sensors/r") }

	// The subscriber below must get it although its PUBACK may come before
	// the retained follower has applied it: a subscription's retained
	// messages wait for the follower to reach the committed offset.
	publish("v1")
	if r := st.records(); len(r) != 1 || !r[0].Retain {
		t.Fatalf("retained publish not in the log with its flag: %v", r)
	}
	sub, _ := dialV3(t, b, "sub")
	got := make(chan paho.Message, 1)
	if tok := sub.Subscribe("sensors/#", 1, func(_ paho.Client, m paho.Message) {
		select {
		case got <- m:
		default:
		}
	}); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	select {
	case m := <-got:
		if string(m.Payload()) != "v1" || !m.Retained() {
			t.Fatalf("new subscriber got %q retained=%v, want v1 retained", m.Payload(), m.Retained())
		}
	case <-ctx.Done():
		t.Fatal("new subscriber did not get the retained message")
	}

	st.fail(errors.New("boom")) // a refused retained publish changes nothing
	pubV5 := dialRaw(t, b, "pub5", 5)
	pubV5.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, TopicName: "sensors/r", PacketID: 1, Payload: []byte("v2")})
	if pk := pubV5.Read(); pk.ReasonCode < 0x80 {
		t.Fatalf("publish acked while the log fails")
	}
	if m := retained(); len(m) != 1 || m[0] != "v1" {
		t.Fatalf("a refused retained publish changed the retained store: %v", m)
	}
	st.fail(nil)

	publish("") // an empty retained payload clears it
	testwait.Eventually(t, "the retained message cleared", func() bool { return len(retained()) == 0 })
	if m := b.Server().Topics.Messages("sensors/r"); len(m) != 0 {
		t.Fatalf("mochi holds a retained message of a captured topic: %v", m)
	}
}

func TestIngest_InlinePublishAppended(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	if err := b.Server().Publish("sensors/inline", []byte("in process"), false, 1); err != nil {
		t.Fatal(err)
	}
	recs := st.waitRecords(t, 1)
	if recs[0].Topic != "sensors/inline" || string(recs[0].Payload) != "in process" {
		t.Fatalf("inline publish record %+v", recs[0])
	}
}

func TestIngest_DelayedWill(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	dialWithDelayedWill := func(t *testing.T, id string, delay uint32) *mqtttest.Raw {
		c := rawConnect(id, 5)
		c.Will = &mqtttest.Will{Topic: "sensors/w/status", Payload: []byte("offline"), Delay: delay}
		return mqtttest.Dial(t, b.Addr().String(), c)
	}
	pendingWills := func() int {
		b.ingest.mu.Lock()
		defer b.ingest.mu.Unlock()
		return len(b.ingest.mu.wills)
	}

	t.Run("cancelled by a reconnect", func(t *testing.T) {
		c := dialWithDelayedWill(t, "back-soon", 3600)
		c.Close()
		testwait.Eventually(t, "the will to be scheduled", func() bool { return pendingWills() == 1 })
		dialRaw(t, b, "back-soon", 5)
		if n := pendingWills(); n != 0 {
			t.Fatalf("%d wills still scheduled after the client reconnected", n)
		}
		if n := st.submitted(); n != 0 {
			t.Fatalf("%d appends: the will was sent although the client came back", n)
		}
	})
	t.Run("sent after the delay", func(t *testing.T) {
		c := dialWithDelayedWill(t, "gone", 1)
		c.Close()
		recs := st.waitRecords(t, 1)
		if recs[0].Topic != "sensors/w/status" || recs[0].ClientID != "gone" {
			t.Fatalf("will record %+v", recs[0])
		}
	})
}

// A publish ingest takes early gets the expiry mochi's processPublish would
// give it (mochi's retained store drops a retained message at its expiry):
// the smaller of the server's maximum and the publish's interval, either
// ignored when zero.
func TestMessageExpiry_IsMochisRule(t *testing.T) {
	for _, c := range []struct{ max, interval, want int64 }{
		{0, 0, 0},
		{0, 30, 30},
		{60, 0, 60},
		{60, 30, 30},
		{60, 90, 60},
	} {
		if got := messageExpiry(c.max, c.interval); got != c.want {
			t.Errorf("messageExpiry(max %d, interval %d) = %d, want %d", c.max, c.interval, got, c.want)
		}
	}
}

// rejectingHook takes publishes on own/ as edge's $mirror/ hook does:
// it answers them itself and tells mochi to drop them.
type rejectingHook struct{ mochi.HookBase }

func (*rejectingHook) ID() string           { return "rejecting" }
func (*rejectingHook) Provides(b byte) bool { return b == mochi.OnPublish }
func (*rejectingHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if !strings.HasPrefix(pk.TopicName, "own/") {
		return pk, nil
	}
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID})
	return pk, packets.ErrRejectPacket
}

// A hook after Peat's that takes a publish on a topic no stream captures
// and answers it itself is not held up by the ack Peat holds until the
// fan-out, which never comes: its answer and the next ones go out.
func TestIngest_AnotherHooksPublishIsAnswered(t *testing.T) {
	b := newTestBroker(t, newMemLog(t, "elsewhere=elsewhere/#"))
	if err := b.srv.AddHook(&rejectingHook{}, nil); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, b, "c", 5)
	publishQoS1(t, c, 1, "own/a", "x", false)
	publishQoS1(t, c, 2, "other/a", "y", false)
	publishQoS1(t, c, 3, "own/b", "z", false)
}
