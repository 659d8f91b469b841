package mqtt

import (
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// payloads returns the payloads of msgs.
func dlvPayloads(msgs []dlvMsg) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.payload
	}
	return out
}

// seq returns "from".."to-1" as strings.
func dlvSeq(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

func TestDelivery_SubscribersGetRecordsFromTheLog(t *testing.T) {
	t.Run("QoS1 subscription gets QoS 1 and QoS 0 records in offset order", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		sub := dialDlvPaho(t, h.addr, "sub")
		sub.subscribe(t, "sensors/#", 1)
		h.appendRecs(t, "default",
			&logstore.Record{Topic: "sensors/a", Payload: []byte("0"), QoS: 1},
			&logstore.Record{Topic: "sensors/b", Payload: []byte("1"), QoS: 0},
			&logstore.Record{Topic: "sensors/a", Payload: []byte("2"), QoS: 1})
		got := sub.waitCount(t, 3)
		if want := []string{"0", "1", "2"}; !slices.Equal(dlvPayloads(got), want) {
			t.Fatalf("payloads %v, want %v", dlvPayloads(got), want)
		}
		if got[0].qos != 1 || got[1].qos != 0 || got[2].qos != 1 {
			t.Fatalf("qos %d %d %d, want 1 0 1 (min of subscription and record)", got[0].qos, got[1].qos, got[2].qos)
		}
	})
	t.Run("QoS0 subscription gets QoS 1 records at QoS 0", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		sub := dialDlvPaho(t, h.addr, "sub")
		sub.subscribe(t, "sensors/#", 0)
		h.appendN(t, "default", "sensors/x", 1, 100)
		got := sub.waitCount(t, 100)
		if !slices.Equal(dlvPayloads(got), dlvSeq(0, 100)) {
			t.Fatalf("payloads %v", dlvPayloads(got))
		}
		for _, m := range got {
			if m.qos != 0 {
				t.Fatalf("delivered at QoS %d, want 0", m.qos)
			}
		}
		// The sender counts a delivery after its write returns, which may be
		// after the client has read it.
		delivered := h.m.Delivered.WithLabelValues("default")
		testwait.Eventually(t, "delivered metric at 100", func() bool { return metricValue(delivered) >= 100 })
		if n := metricValue(delivered); n != 100 {
			t.Fatalf("delivered metric %v, want 100", n)
		}
	})
	t.Run("subscriber starts at the committed offset", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		h.appendN(t, "default", "sensors/old", 1, 5)
		sub := dialDlvPaho(t, h.addr, "sub")
		sub.subscribe(t, "sensors/#", 1)
		h.appendRecs(t, "default", &logstore.Record{Topic: "sensors/new", Payload: []byte("new"), QoS: 1})
		got := sub.waitCount(t, 1)
		if got[0].payload != "new" {
			t.Fatalf("first delivery %q, want the record appended after subscribing", got[0].payload)
		}
	})
	t.Run("retain flag is cleared for v3 live deliveries", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		sub := dialDlvPaho(t, h.addr, "sub")
		sub.subscribe(t, "sensors/#", 1)
		// Appended after the SUBACK: at or above the subscription's start,
		// so it is a live record, never one of its retained messages
		// (delivery_retained.go).
		h.appendRecs(t, "default", &logstore.Record{Topic: "sensors/a", Payload: []byte("r"), QoS: 1, Retain: true})
		if got := sub.waitCount(t, 1); got[0].retain {
			t.Fatal("live delivery kept the retain flag")
		}
	})
}

func TestDelivery_TopicMatching(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "telemetry=sensors/#", "power=meters/+/power")
	plus := dialDlvPaho(t, h.addr, "plus")
	plus.subscribe(t, "sensors/+/temp", 1)
	hash := dialDlvPaho(t, h.addr, "hash")
	hash.subscribe(t, "#", 1)
	meters := dialDlvPaho(t, h.addr, "meters")
	meters.subscribe(t, "meters/#", 1)

	h.appendRecs(t, "telemetry",
		&logstore.Record{Topic: "sensors/a/temp", Payload: []byte("t1"), QoS: 1},
		&logstore.Record{Topic: "sensors/a/hum", Payload: []byte("h1"), QoS: 1},
		&logstore.Record{Topic: "sensors/b/temp", Payload: []byte("t2"), QoS: 1},
		&logstore.Record{Topic: "sensors/a/temp/x", Payload: []byte("deep"), QoS: 1})
	h.appendRecs(t, "power", &logstore.Record{Topic: "meters/m1/power", Payload: []byte("p1"), QoS: 1})

	// '#' sees both streams; order is per stream.
	all := hash.waitCount(t, 5)
	var tele, pow []string
	for _, m := range all {
		if m.topic == "meters/m1/power" {
			pow = append(pow, m.payload)
		} else {
			tele = append(tele, m.payload)
		}
	}
	if !slices.Equal(tele, []string{"t1", "h1", "t2", "deep"}) || !slices.Equal(pow, []string{"p1"}) {
		t.Fatalf("'#' got %v and %v", tele, pow)
	}
	// A marker on each stream: once it arrives, nothing else can still come.
	h.appendRecs(t, "telemetry", &logstore.Record{Topic: "sensors/z/temp", Payload: []byte("end"), QoS: 1})
	h.appendRecs(t, "power", &logstore.Record{Topic: "meters/z/power", Payload: []byte("end"), QoS: 1})
	if got := dlvPayloads(plus.waitCount(t, 3)); !slices.Equal(got, []string{"t1", "t2", "end"}) {
		t.Fatalf("sensors/+/temp got %v", got)
	}
	if got := dlvPayloads(meters.waitCount(t, 2)); !slices.Equal(got, []string{"p1", "end"}) {
		t.Fatalf("meters/# got %v", got)
	}
}

func TestDelivery_FanOut(t *testing.T) {
	t.Run("two subscribers each get everything once", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		a := dialDlvPaho(t, h.addr, "a")
		a.subscribe(t, "s/#", 1)
		b := dialDlvPaho(t, h.addr, "b")
		b.subscribe(t, "s/+", 1)
		h.appendN(t, "default", "s/x", 1, 1000)
		h.appendRecs(t, "default", &logstore.Record{Topic: "s/x", Payload: []byte("end"), QoS: 1})
		want := append(dlvSeq(0, 1000), "end")
		for _, c := range []*dlvPaho{a, b} {
			c.waitCount(t, len(want))
			if got := dlvPayloads(c.received()); !slices.Equal(got, want) {
				t.Fatalf("got %d messages, want %d in order", len(got), len(want))
			}
		}
	})
	t.Run("overlapping subscriptions deliver once at the highest QoS", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		c := dialDlvPaho(t, h.addr, "c")
		c.subscribe(t, "s/#", 0)
		c.subscribe(t, "s/+", 1)
		h.appendN(t, "default", "s/x", 1, 10)
		h.appendRecs(t, "default", &logstore.Record{Topic: "s/x", Payload: []byte("end"), QoS: 1})
		got := c.waitCount(t, 11)
		if !slices.Equal(dlvPayloads(got), append(dlvSeq(0, 10), "end")) {
			t.Fatalf("got %v", dlvPayloads(got))
		}
		for _, m := range got {
			if m.qos != 1 {
				t.Fatalf("qos %d, want 1 (the higher of the overlapping subscriptions)", m.qos)
			}
		}
	})
	t.Run("a $share group gets each record once across its members", func(t *testing.T) {
		h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
		m1 := dialDlvPaho(t, h.addr, "m1")
		m1.subscribe(t, "$share/g/s/#", 1)
		m2 := dialDlvPaho(t, h.addr, "m2")
		m2.subscribe(t, "$share/g/s/#", 1)
		const n = 200
		h.appendN(t, "default", "s/x", 1, n)
		testwait.Eventually(t, "the group to get every record", func() bool {
			return len(m1.received())+len(m2.received()) >= n
		})
		// A marker to each member proves nothing more is on its way.
		h.appendRecs(t, "default",
			&logstore.Record{Topic: "s/x", Payload: []byte("end1"), QoS: 1},
			&logstore.Record{Topic: "s/x", Payload: []byte("end2"), QoS: 1})
		testwait.Eventually(t, "the markers", func() bool { return len(m1.received())+len(m2.received()) >= n+2 })
		all := append(dlvPayloads(m1.received()), dlvPayloads(m2.received())...)
		sort.Strings(all)
		want := append(dlvSeq(0, n), "end1", "end2")
		sort.Strings(want)
		if !slices.Equal(all, want) {
			t.Fatalf("group got %d records (%d + %d), want each of %d once", len(all), len(m1.received()), len(m2.received()), len(want))
		}
		if len(m1.received()) == 0 || len(m2.received()) == 0 {
			t.Fatalf("one member got nothing: %d and %d", len(m1.received()), len(m2.received()))
		}
	})
}

func TestDelivery_MQTTPublishes(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "telemetry=sensors/#")
	sub := dialDlvPaho(t, h.addr, "sub")
	sub.subscribe(t, "sensors/#", 1)
	sub.subscribe(t, "other/#", 1)
	pub := dialDlvPaho(t, h.addr, "pub")

	t.Run("captured topic comes from the log, once", func(t *testing.T) {
		for i := range 20 {
			pub.publish(t, "sensors/a", 1, strconv.Itoa(i))
		}
		h.log.stream(t, "telemetry").waitRecords(t, 20)
		pub.publish(t, "sensors/a", 1, "end")
		got := sub.waitCount(t, 21)
		if !slices.Equal(dlvPayloads(got), append(dlvSeq(0, 20), "end")) {
			t.Fatalf("got %v", dlvPayloads(got))
		}
	})
	t.Run("topic no stream captures goes through mochi", func(t *testing.T) {
		before := len(sub.received())
		pub.publish(t, "other/x", 1, "plain")
		got := sub.waitCount(t, before+1)
		if m := got[before]; m.topic != "other/x" || m.payload != "plain" {
			t.Fatalf("got %+v", m)
		}
		if n := len(h.log.stream(t, "telemetry").records()); n != 21 {
			t.Fatalf("log holds %d records, want 21 (other/x is not captured)", n)
		}
	})
}

// A wake with nothing new to read (a site's watermark moves between a
// reader's Changed and its read, every follower fetch) does not hold up
// what is committed next: the reader waits on a fresh channel, and pauses
// deliveryRetryDelay only for a stream whose Changed stays closed. Here
// the pause is an hour, so a reader that paused would not deliver.
func TestDelivery_WakeWithNothingNewDoesNotStall(t *testing.T) {
	saved := deliveryRetryDelay
	deliveryRetryDelay = time.Hour
	t.Cleanup(func() { deliveryRetryDelay = saved })
	h := newDeliveryHarness(t, testDeliveryConfig(), "default=#")
	sub := dialDlvPaho(t, h.addr, "sub")
	sub.subscribe(t, "sensors/#", 1)
	h.appendN(t, "default", "sensors/x", 1, 1)
	sub.waitCount(t, 1)
	s := h.log.stream(t, "default")
	for i := range 3 {
		testwait.Eventually(t, "the reader to wait for the stream", func() bool { return parkedIn("(*deliveryCursor).wait") })
		s.Wake()
		h.appendN(t, "default", "sensors/x", 1, 1)
		if got := sub.waitCount(t, 2+i); len(got) != 2+i {
			t.Fatalf("%d delivered after wake %d, want %d", len(got), i+1, 2+i)
		}
	}
}
