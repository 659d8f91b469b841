package mqtt

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// Consumer positions live in the stream they point into (Stream's own
// state), the stream decides a group's single consumer, and a stream
// whose state moved (a cluster made this node its leader) is read again.

// A group's consumer is the one the stream grants: a claim held elsewhere
// (another node's consumer, in a cluster) refuses a subscriber here, and a
// consumer here holds the stream's claim until it leaves.
func TestGroup_TheStreamDecidesTheConsumer(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	if ok, _ := s.Claim("g/g", "worker-on-node-2"); !ok {
		t.Fatal("claim refused")
	}
	c := dialRaw(t, b, "here", 5)
	ack := c.TrySubscribe("$group/g/+/t/#", 1)
	if ack.ReasonCodes[0] != subackNotAccepted || !strings.Contains(ack.Properties.ReasonString, `"worker-on-node-2"`) {
		t.Fatalf("SUBACK %#x %q, want 0x83 naming the stream's holder", ack.ReasonCodes[0], ack.Properties.ReasonString)
	}
	s.Unclaim("g/g", "worker-on-node-2")
	c.Subscribe("$group/g/+/t/#", 1)
	if ok, holder := s.Claim("g/g", "worker-on-node-2"); ok || holder != "here" {
		t.Fatalf("while subscribed here, the stream's Claim = %v %q, want held by %q", ok, holder, "here")
	}
	c.Unsubscribe("$group/g/+/t/#")
	testwait.Eventually(t, "the claim to be released", func() bool {
		ok, _ := s.Claim("g/g", "worker-on-node-2")
		return ok
	})
}

// When a stream's state moves here, its groups continue from the offsets
// it brings: a connected consumer seeks to its group's new offset, a new
// one starts there, and $offsets shows it.
func TestGroup_FollowsMovedState(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	store(t, s, topicsN("t", 0, 20), nil)
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "worker", 5)
	c.Subscribe("$group/g/+/t/#", 1)
	for _, pk := range readPublishes(t, c, 20) {
		c.Puback(pk.PacketID)
	}
	acksRead(t, c)
	testwait.Eventually(t, "the commit of 20", func() bool { return groupOffset(t, b, "g", "default") == 20 })
	watcher := dialRaw(t, b, "watcher", 5)
	watcher.Subscribe("$offsets/g/default", 1)
	for pk := readPublishes(t, watcher, 1)[0]; string(pk.Payload) != "20"; pk = readPublishes(t, watcher, 1)[0] {
		// the durable offset may still be on its way to 20
	}

	if err := s.MoveState(map[string][]byte{"g/g": encodeOffset(12)}, nil); err != nil {
		t.Fatal(err)
	}
	if pk := readPublishes(t, watcher, 1)[0]; string(pk.Payload) != "12" {
		t.Fatalf("$offsets after the move: %q, want 12", pk.Payload)
	}
	pks := readPublishes(t, c, 8)
	for i, pk := range pks {
		if off := offsetOf(t, pk.TopicName); off != 12+i {
			t.Fatalf("after the move, delivery %d has offset %d, want %d", i, off, 12+i)
		}
		c.Puback(pk.PacketID)
	}
	acksRead(t, c)
	expectNext(t, c, s, "t/20")
	c.Close()

	// A group this node never saw, brought by the move, starts where it says.
	if err := s.MoveState(map[string][]byte{"g/other": encodeOffset(17)}, nil); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "the moved group to be known", func() bool {
		off, ok := b.deliv.groups.position(groupKey{group: "other", stream: "default"})
		return ok && off == 17
	})
	n := dialRaw(t, b, "newcomer", 5)
	if ack := n.Subscribe("$group/other/+/t/#", 1); userProp(ack.Properties, propStart) != "17" {
		t.Fatalf("SUBACK start %q, want 17", userProp(ack.Properties, propStart))
	}
}

// A durable session's offsets are in the stream's state, and one moved
// there from elsewhere is where the session resumes.
func TestDurableSession_FollowsMovedState(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	c := dialDurable(t, b, 5)
	c.Subscribe("d/#", 1)
	store(t, s, topicsN("d", 0, 3), nil)
	expectTopics(t, c, s, "d", 0, 3)
	acksRead(t, c)
	leave(t, b, c)
	if v, ok := l.streamStateValue("default", "s/dur"); !ok || binary.BigEndian.Uint64(v) != 4 {
		t.Fatalf("the stream's state holds the session's offset %x (%v), want 4", v, ok)
	}

	store(t, s, topicsN("d", 3, 10), nil)
	if err := s.MoveState(map[string][]byte{"s/dur": encodeOffset(9)}, nil); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "the moved offset to be loaded", func() bool {
		off, _ := b.deliv.sessions.offset("dur", cursorKey{stream: "default"})
		return off == 9
	})
	c = dialDurable(t, b, 5)
	expectTopics(t, c, s, "d", 8, 5) // offset 9 holds d/8: the marker d/3 took offset 3

	// A clean start ends the session: its offset leaves the stream's state.
	c.Close()
	testwait.Eventually(t, "the client to go", func() bool { return b.Clients() == 0 })
	clean := durableConnect("dur", 5)
	clean.Clean = true
	clean.Properties.SessionExpiryInterval, clean.Properties.SessionExpiryIntervalFlag = 0, false
	mqtttest.Dial(t, b.Addr().String(), clean).Close()
	testwait.Eventually(t, "the session's offset to be deleted", func() bool {
		_, ok := l.streamStateValue("default", "s/dur")
		return !ok && !storedSession(l, "dur")
	})
}

// Positions stored by a Peat of key layout 3 in the log's state move into
// their streams at start: groups and sessions resume where they were.
func TestState_MovesLayout3Positions(t *testing.T) {
	l := newMemLog(t, "default=#", "replay=r/#")
	s := l.stream(t, "default")
	store(t, s, topicsN("d", 0, 10), nil)
	store(t, l.stream(t, "replay"), topicsN("r", 0, 10), nil)
	old := session{
		ProtocolVersion: 5, Expiry: 3600, ExpiryFlag: true,
		Subs: map[string]sessionSub{
			"d/#":                    {Filter: "d/#", Qos: 1},
			"$replay/earliest/+/r/#": {Filter: "$replay/earliest/+/r/#", Qos: 1},
		},
		Legacy: map[string]uint64{"default": 6, "$tap:$replay/earliest/+/r/#": 8, "gone": 3},
	}
	val, err := msgpack.Marshal(&old)
	if err != nil {
		t.Fatal(err)
	}
	err = l.State().WriteState(map[string][]byte{
		"g/billing/default": encodeOffset(4),
		"g/billing/gone":    encodeOffset(2),
		"s/dur":             val,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newTestBroker(t, l)

	if v, ok := l.streamStateValue("default", "g/billing"); !ok || binary.BigEndian.Uint64(v) != 4 {
		t.Fatalf("group offset in the stream's state: %x %v, want 4", v, ok)
	}
	if _, ok := l.stateValue("g/billing/default"); ok {
		t.Error("the old group entry is still in the log's state")
	}
	if _, ok := l.stateValue("g/billing/gone"); !ok {
		t.Error("the group entry of a stream the log does not have was dropped, want kept")
	}
	c := dialRaw(t, b, "worker", 5)
	if ack := c.Subscribe("$group/billing/+/d/#", 1); userProp(ack.Properties, propStart) != "4" {
		t.Fatalf("group resumes at %q, want 4", userProp(ack.Properties, propStart))
	}
	c.Close()

	d := dialDurable(t, b, 5)
	if !d.Connack.SessionPresent {
		t.Fatal("session not present")
	}
	got := map[string]int{}
	for _, pk := range readPublishes(t, d, 4+2) {
		got[strings.SplitN(pk.TopicName, "/", 2)[0]]++
		var n int
		switch {
		case strings.HasPrefix(pk.TopicName, "$replay/"):
			if off := offsetOf(t, pk.TopicName); off < 8 {
				t.Fatalf("replay resumed at %d, want 8", off)
			}
		case func() bool { _, err := fmt.Sscanf(pk.TopicName, "d/%d", &n); return err != nil }() || n < 6:
			t.Fatalf("session resumed with %q, want d/6", pk.TopicName)
		}
	}
	if got["d"] != 4 || got["$replay"] != 2 {
		t.Fatalf("deliveries by kind %v, want 4 live and 2 replayed", got)
	}
	v, ok := l.stateValue("s/dur")
	var now session
	if !ok || msgpack.Unmarshal(v, &now) != nil {
		t.Fatal("session gone from the log's state")
	}
	if len(now.Legacy) != 1 || now.Legacy["gone"] != 3 {
		t.Errorf("session's old offsets left %v, want only gone=3 (no such stream)", now.Legacy)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
