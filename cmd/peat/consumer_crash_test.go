package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// publishAll publishes n QoS 1 messages "<id>/<seq>" on topic and fails
// unless every one is acknowledged.
func publishAll(t *testing.T, p *peatProc, id, topic string, n int) {
	t.Helper()
	pub := newPublisher(t, p.mqttAddr, id, topic, 32)
	pub.publish(n)
	if acked := pub.wait(); len(acked) != n {
		t.Fatalf("%s: %d of %d publishes acknowledged", id, len(acked), n)
	}
}

// readPublish reads the next PUBLISH from c, acknowledging it when ack.
func readPublish(t *testing.T, c *mqtttest.Raw, ack bool) packets.Packet {
	t.Helper()
	for {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			continue // PINGRESP, SUBACK
		}
		if ack && pk.FixedHeader.Qos > 0 {
			c.Puback(pk.PacketID)
		}
		return pk
	}
}

// A consumer group's committed offset and a durable session's position
// survive kill -9 of the broker: after the restart the group continues at
// its committed offset, and the session, found present, gets everything it
// missed while offline and while the broker was down, in order.
func TestCrash_ConsumersResumeAfterKill9(t *testing.T) {
	data := t.TempDir()
	p := startPeat(t, data)

	// A durable session (clean session false) takes the first 200 and goes.
	durable := mqtttest.Connect{ClientID: "dur", Version: 4, Keepalive: 60}
	dur := mqtttest.Dial(t, p.mqttAddr, durable)
	dur.Subscribe("sensors/#", 1)
	publishAll(t, p, "a", "sensors/a", 200)
	for i := range 200 {
		if pk := readPublish(t, dur, true); string(pk.Payload) != fmt.Sprintf("a/%d", i) {
			t.Fatalf("durable session, message %d: %q", i, pk.Payload)
		}
	}
	dur.Ping()
	dur.ReadUntil(packets.Pingresp) // every PUBACK was read
	dur.Close()

	publishAll(t, p, "b", "sensors/a", 100) // offsets 200..299, while the session is offline

	// A group consumer acknowledges offsets 0..99 of what it gets; a watcher
	// of $offsets sees when 100 is stored.
	watch := mqtttest.Dial(t, p.mqttAddr, mqtttest.Connect{ClientID: "watch", Version: 4, Clean: true, Keepalive: 60})
	watch.Subscribe("$offsets/g/default", 1)
	group := mqtttest.Dial(t, p.mqttAddr, mqtttest.Connect{ClientID: "worker", Version: 4, Clean: true, Keepalive: 60})
	group.Subscribe("$group/g/+/sensors/#", 1)
	for i := range 120 {
		pk := readPublish(t, group, i < 100)
		if want := fmt.Sprintf("$group/g/%d/sensors/a", i); pk.TopicName != want {
			t.Fatalf("group delivery %d: %q, want %q", i, pk.TopicName, want)
		}
	}
	for string(readPublish(t, watch, true).Payload) != "100" {
	}

	p.kill()
	p = startPeat(t, data)
	publishAll(t, p, "c", "sensors/a", 50) // offsets 300..349

	// The group continues exactly at its committed offset.
	group = mqtttest.Dial(t, p.mqttAddr, mqtttest.Connect{ClientID: "worker-2", Version: 4, Clean: true, Keepalive: 60})
	group.Subscribe("$group/g/+/sensors/#", 1)
	for want := 100; want < 350; want++ {
		pk := readPublish(t, group, true)
		off, _ := strconv.Atoi(strings.Split(pk.TopicName, "/")[2])
		if off != want {
			t.Fatalf("group after kill -9: offset %d, want %d", off, want)
		}
	}

	// The session is present and gets b/0..99 and c/0..49 in order. Its
	// last progress may not have been written before the kill: then some of
	// a/... come first, again, in order (at least once, never a gap).
	dur = mqtttest.Dial(t, p.mqttAddr, durable)
	if !dur.Connack.SessionPresent {
		t.Fatal("durable session not present after kill -9")
	}
	var got []string
	for len(got) == 0 || got[len(got)-1] != "c/49" {
		got = append(got, string(readPublish(t, dur, true).Payload))
	}
	var want []string
	for i := range 100 {
		want = append(want, fmt.Sprintf("b/%d", i))
	}
	for i := range 50 {
		want = append(want, fmt.Sprintf("c/%d", i))
	}
	repeats := len(got) - len(want)
	if repeats < 0 || strings.Join(got[repeats:], ",") != strings.Join(want, ",") {
		t.Fatalf("durable session after kill -9 got %d messages %v..., want b/0..99 then c/0..49", len(got), got[:min(len(got), 5)])
	}
	for i, m := range got[:repeats] {
		if m != fmt.Sprintf("a/%d", 200-repeats+i) {
			t.Fatalf("repeat %d is %q: repeats must be the last of a/..., in order", i, m)
		}
	}
	t.Logf("durable session: %d messages delivered again after kill -9", repeats)
}

// What a durable session was sent and did not acknowledge goes again with
// DUP 1 after kill -9 of the broker [MQTT-3.3.1-1]: the session's resend
// marks reach the store while it is connected, within the state writer's
// interval (100 ms) of the writes.
func TestCrash_ResendsAfterKill9CarryDup(t *testing.T) {
	data := t.TempDir()
	p := startPeat(t, data)
	durable := mqtttest.Connect{ClientID: "dur", Version: 5, Keepalive: 60}
	durable.Properties.SessionExpiryInterval, durable.Properties.SessionExpiryIntervalFlag = 3600, true
	dur := mqtttest.Dial(t, p.mqttAddr, durable)
	dur.Subscribe("sensors/#", 1)
	publishAll(t, p, "a", "sensors/a", 3)
	for i := range 3 {
		if pk := readPublish(t, dur, false); pk.FixedHeader.Dup || string(pk.Payload) != fmt.Sprintf("a/%d", i) {
			t.Fatalf("first delivery %d: %q DUP %v", i, pk.Payload, pk.FixedHeader.Dup)
		}
	}
	time.Sleep(time.Second) // ten state-writer intervals

	p.kill()
	p = startPeat(t, data)
	dur = mqtttest.Dial(t, p.mqttAddr, durable)
	if !dur.Connack.SessionPresent {
		t.Fatal("durable session not present after kill -9")
	}
	for i := range 3 {
		if pk := readPublish(t, dur, true); !pk.FixedHeader.Dup || string(pk.Payload) != fmt.Sprintf("a/%d", i) {
			t.Fatalf("resend %d after kill -9: %q DUP %v, want a/%d with DUP 1", i, pk.Payload, pk.FixedHeader.Dup, i)
		}
	}
	publishAll(t, p, "b", "sensors/a", 1)
	if pk := readPublish(t, dur, true); pk.FixedHeader.Dup || string(pk.Payload) != "b/0" {
		t.Fatalf("new record: %q DUP %v, want b/0 with DUP 0", pk.Payload, pk.FixedHeader.Dup)
	}
}
