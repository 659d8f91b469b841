package mqtt

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// publishExpiring publishes topic at QoS 1 with the Message Expiry Interval
// expiry (0: none) from the MQTT 5 client p, and waits for its PUBACK: the
// record is then in the log.
func publishExpiring(tb testing.TB, p *mqtttest.Raw, topic string, id uint16, expiry uint32) {
	tb.Helper()
	p.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName:   topic,
		PacketID:    id,
		Payload:     []byte(topic),
		Properties:  packets.Properties{MessageExpiryInterval: expiry},
	})
	if ack := p.ReadUntil(packets.Puback); ack.PacketID != id || ack.ReasonCode != 0 {
		tb.Fatalf("publish %s: PUBACK id %d reason %#x", topic, ack.PacketID, ack.ReasonCode)
	}
}

// publishMixed publishes "<prefix>/0".."<prefix>/3" from a new MQTT 5
// client: 0 without expiry, 1 and 3 expiring after 1 s, 2 after an hour.
// It returns once the client has gone.
func publishMixed(tb testing.TB, b *Broker, prefix string) {
	tb.Helper()
	p := dialRaw(tb, b, "producer", 5)
	for i, expiry := range []uint32{0, 1, 3600, 1} {
		publishExpiring(tb, p, fmt.Sprintf("%s/%d", prefix, i), uint16(i+1), expiry)
	}
	p.Close()
}

// waitExpired waits on the clock until the record at off has outlived its
// Message Expiry Interval.
func waitExpired(tb testing.TB, s *memStream, off int) {
	tb.Helper()
	rec := s.records()[off]
	if rec.MessageExpiry == 0 {
		tb.Fatalf("record %d (%s) was stored without its message expiry", off, rec.Topic)
	}
	deadline := rec.Timestamp + int64(rec.MessageExpiry)*1000
	testwait.Eventually(tb, fmt.Sprintf("record %d to expire", off), func() bool { return time.Now().UnixMilli() >= deadline })
}

// expiryOfPublish is a delivery's Message Expiry Interval and its "expired"
// user property.
func expiryOfPublish(pk packets.Packet) (uint32, string) {
	return pk.Properties.MessageExpiryInterval, userProp(pk.Properties, propExpired)
}

// A live MQTT 5 subscriber gets a publish's Message Expiry Interval, less
// the time it spent in the broker: never more than was sent, never 0.
// Records without expiry carry none.
func TestExpiry_LiveSubscriberGetsWhatIsLeft(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	sub := dialRaw(t, b, "sub", 5)
	sub.Subscribe("e/#", 1)
	p := dialRaw(t, b, "producer", 5)
	publishExpiring(t, p, "e/60", 1, 60)
	publishExpiring(t, p, "e/none", 2, 0)

	got := readPublishes(t, sub, 2)
	if left := got[0].Properties.MessageExpiryInterval; left == 0 || left > 60 {
		t.Errorf("%s: Message Expiry Interval %d, want 1..60", got[0].TopicName, left)
	}
	if left := got[1].Properties.MessageExpiryInterval; left != 0 {
		t.Errorf("%s: Message Expiry Interval %d, want none", got[1].TopicName, left)
	}
	if rec := l.stream(t, "default").records()[0]; rec.MessageExpiry != 60 {
		t.Errorf("stored message expiry %d, want 60", rec.MessageExpiry)
	}
}

// A record whose lifetime has passed when the shared reader reaches it is
// skipped for every live subscriber, MQTT 3.1.1 and 5 alike, and for a
// $share group; the records around it are delivered.
func TestExpiry_LiveSkipsExpired(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	subs := []*mqtttest.Raw{dialRaw(t, b, "v5", 5), dialRaw(t, b, "v3", 4), dialRaw(t, b, "shared", 5)}
	subs[0].Subscribe("e/#", 1)
	subs[1].Subscribe("e/#", 1)
	subs[2].Subscribe("$share/s/e/#", 1)

	// Stored ten seconds ago with a lifetime of one, as a record that
	// waited out its lifetime before reaching the log's end would be.
	past := time.Now().Add(-10 * time.Second).UnixMilli()
	recs := []*logstore.Record{
		{Topic: "e/0", Payload: []byte("0"), QoS: 1},
		{Topic: "e/1", Payload: []byte("1"), QoS: 1, Timestamp: past, MessageExpiry: 1},
		{Topic: "e/2", Payload: []byte("2"), QoS: 1, MessageExpiry: 3600},
	}
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, c := range subs {
		got := readPublishes(t, c, 2)
		if got[0].TopicName != "e/0" || got[1].TopicName != "e/2" {
			t.Fatalf("got %q, %q; want e/0, e/2", got[0].TopicName, got[1].TopicName)
		}
	}
	// Each subscription delivers in log order: a late e/1 would come first.
	store(t, s, []string{"e/3"}, nil)
	for _, c := range subs {
		if pk := readPublishes(t, c, 1)[0]; pk.TopicName != "e/3" {
			t.Fatalf("got %q, want e/3", pk.TopicName)
		}
	}
	if n := metricValue(b.deliv.m.Dropped.WithLabelValues(ReasonExpired)); n != 3 {
		t.Errorf("dropped{expired} = %v, want 3", n)
	}
}

// A durable session that comes back after records expired gets the records
// around them, not them, and its position moves past them, also past an
// expired last record.
func TestExpiry_DurableSessionSkipsExpired(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l)
			c := dialDurable(t, b, version)
			c.Subscribe("d/#", 1)
			leave(t, b, c)

			publishMixed(t, b, "d")
			testwait.Eventually(t, "the producer to go", func() bool { return b.Clients() == 0 })
			waitExpired(t, s, 1)
			waitExpired(t, s, 3)

			c = dialDurable(t, b, version)
			got := readPublishes(t, c, 2)
			if got[0].TopicName != "d/0" || got[1].TopicName != "d/2" {
				t.Fatalf("got %q, %q; want d/0, d/2", got[0].TopicName, got[1].TopicName)
			}
			if left := got[1].Properties.MessageExpiryInterval; version == 5 && (left == 0 || left > 3600) {
				t.Errorf("d/2: Message Expiry Interval %d, want 1..3600", left)
			}
			testwait.Eventually(t, "the session's position to pass the expired records", func() bool {
				off, ok := b.deliv.sessions.offset("dur", cursorKey{stream: "default"})
				return ok && off == 4
			})
			expectNext(t, c, s, "d/4")
		})
	}
}

// A $group consumer does not get expired records, and the group's
// committed offset moves past them.
func TestExpiry_GroupSkipsExpired(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			l := newMemLog(t, "default=#")
			s := l.stream(t, "default")
			b := newTestBroker(t, l)
			publishMixed(t, b, "t")
			waitExpired(t, s, 1)
			waitExpired(t, s, 3)

			c := dialRaw(t, b, "worker", version)
			c.Subscribe("$group/g/+/t/#", 1)
			got := readPublishes(t, c, 2)
			if got[0].TopicName != "$group/g/0/t/0" || got[1].TopicName != "$group/g/2/t/2" {
				t.Fatalf("got %q, %q; want offsets 0 and 2", got[0].TopicName, got[1].TopicName)
			}
			if left := got[1].Properties.MessageExpiryInterval; version == 5 && (left == 0 || left > 3600) {
				t.Errorf("offset 2: Message Expiry Interval %d, want 1..3600", left)
			}
			testwait.Eventually(t, "the group's commit to pass the expired records", func() bool {
				off, ok := b.deliv.groups.position(groupKey{group: "g", stream: "default"})
				return ok && off == 4
			})
			expectNext(t, c, s, "t/4")
		})
	}
}

// $replay shows history, expired records included: those without the
// Message Expiry Interval and, for MQTT 5, with the user property
// "expired" (when, unix ms); records still alive with what is left of it.
func TestExpiry_ReplayShowsExpiredMarked(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	publishMixed(t, b, "t")
	waitExpired(t, s, 1)
	waitExpired(t, s, 3)
	recs := s.records()
	expiredAt := func(off int) string {
		return strconv.FormatInt(recs[off].Timestamp+int64(recs[off].MessageExpiry)*1000, 10)
	}

	v5 := dialRaw(t, b, "replay5", 5)
	v5.Subscribe("$replay/earliest/+/t/#", 1)
	got := readPublishes(t, v5, 4)
	for i, pk := range got {
		if want := fmt.Sprintf("$replay/earliest/%d/t/%d", i, i); pk.TopicName != want {
			t.Fatalf("delivery %d: %q, want %q", i, pk.TopicName, want)
		}
	}
	if left, exp := expiryOfPublish(got[0]); left != 0 || exp != "" {
		t.Errorf("offset 0, no expiry: interval %d, expired %q; want neither", left, exp)
	}
	for _, off := range []int{1, 3} {
		if left, exp := expiryOfPublish(got[off]); left != 0 || exp != expiredAt(off) {
			t.Errorf("offset %d, expired: interval %d, expired %q; want none and %s", off, left, exp, expiredAt(off))
		}
	}
	if left, exp := expiryOfPublish(got[2]); left == 0 || left > 3600 || exp != "" {
		t.Errorf("offset 2, alive: interval %d, expired %q; want 1..3600 and none", left, exp)
	}
	expectNext(t, v5, s, "t/4")

	v3 := dialRaw(t, b, "replay3", 4)
	v3.Subscribe("$replay/earliest/+/t/#", 1)
	for i, pk := range readPublishes(t, v3, 5) {
		if want := fmt.Sprintf("$replay/earliest/%d/t/%d", i, i); pk.TopicName != want {
			t.Fatalf("v3 delivery %d: %q, want %q", i, pk.TopicName, want)
		}
	}
	expectNext(t, v3, s, "t/5")
	if n := metricValue(b.deliv.m.Dropped.WithLabelValues(ReasonExpired)); n != 0 {
		t.Errorf("dropped{expired} = %v, want 0: replay drops nothing", n)
	}
}
