package mqtt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// groupOffset is the group's committed offset as the broker knows it.
func groupOffset(tb testing.TB, b *Broker, group, stream string) uint64 {
	tb.Helper()
	off, ok := b.deliv.groups.position(groupKey{group: group, stream: stream})
	if !ok {
		tb.Fatalf("group %s has no offset in %s", group, stream)
	}
	return off
}

// offsetOf returns the offset level of a delivered extension topic.
func offsetOf(tb testing.TB, topic string) int {
	tb.Helper()
	parts := strings.SplitN(topic, "/", 4)
	var off int
	if len(parts) < 4 {
		tb.Fatalf("topic %q has no offset level", topic)
	}
	if _, err := fmt.Sscan(parts[2], &off); err != nil {
		tb.Fatalf("topic %q: offset level: %v", topic, err)
	}
	return off
}

// A QoS 1 group consumer that goes away and comes back continues from the
// end of what it acknowledged; duplicates are at most what was in flight.
func TestGroup_ResumesFromTheAcknowledgedPrefix(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	store(t, s, topicsN("t", 0, 20), nil)
	b := newTestBroker(t, l)

	a := dialRaw(t, b, "worker-1", 5)
	a.Subscribe("$group/billing/+/t/#", 1)
	var got []packets.Packet
	for range 20 {
		got = append(got, a.Read())
	}
	// Acknowledge all but 7 and 9: the prefix ends at 7.
	for i, pk := range got {
		if want := fmt.Sprintf("$group/billing/%d/t/%d", i, i); pk.TopicName != want {
			t.Fatalf("delivery %d: %q, want %q", i, pk.TopicName, want)
		}
		if i != 7 && i != 9 {
			a.Puback(pk.PacketID)
		}
	}
	acksRead(t, a)
	if off := groupOffset(t, b, "billing", "default"); off != 7 {
		t.Fatalf("committed %d, want 7", off)
	}
	a.Close()

	// Another client of the group takes over once the first has gone.
	c := dialRaw(t, b, "worker-2", 5)
	testwait.Eventually(t, "worker-1 to go", func() bool { return b.Clients() == 1 })
	ack := c.Subscribe("$group/billing/+/t/#", 1)
	if got := userProp(ack.Properties, propStart); got != "7" {
		t.Fatalf("SUBACK start %q, want 7", got)
	}
	pks := readPublishes(t, c, 13)
	for i, pk := range pks {
		if off := offsetOf(t, pk.TopicName); off != 7+i {
			t.Fatalf("after takeover, delivery %d has offset %d, want %d", i, off, 7+i)
		}
	}
	// The next record is the next delivery: nothing was repeated.
	expectNext(t, c, s, "t/20")
	testwait.Eventually(t, "the commit of all 21", func() bool { return groupOffset(t, b, "billing", "default") == 21 })
}

func TestGroup_OneConsumerAtATime(t *testing.T) {
	l := newMemLog(t, "default=#", "other=o/#")
	b := newTestBroker(t, l)
	a := dialRaw(t, b, "first", 5)
	a.Subscribe("$group/g/+/t/#", 1)

	second := dialRaw(t, b, "second", 5)
	ack := second.TrySubscribe("$group/g/+/t/+", 1) // same group, same stream
	if ack.ReasonCodes[0] != subackNotAccepted || !strings.Contains(ack.Properties.ReasonString, `client "first"`) {
		t.Fatalf("second consumer: SUBACK %#x %q, want 0x83 naming the first", ack.ReasonCodes[0], ack.Properties.ReasonString)
	}
	v3 := dialRaw(t, b, "third", 4)
	if ack := v3.TrySubscribe("$group/g/+/t/#", 1); ack.ReasonCodes[0] != 0x80 {
		t.Fatalf("v3 second consumer: SUBACK %#x, want 0x80", ack.ReasonCodes[0])
	}
	// The same group in another stream is another partition: allowed.
	second.Subscribe("$group/g/+/o/#", 1)

	a.Unsubscribe("$group/g/+/t/#")
	second.Subscribe("$group/g/+/t/#", 1) // the first gave it up
}

// QoS 0 group deliveries commit when written.
func TestGroup_QoS0CommitsOnSend(t *testing.T) {
	l := newMemLog(t, "default=#")
	store(t, l.stream(t, "default"), topicsN("t", 0, 5), nil)
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "q0", 4)
	c.Subscribe("$group/g0/+/#", 0)
	readPublishes(t, c, 5)
	testwait.Eventually(t, "commit of 5", func() bool {
		off, ok := b.deliv.groups.position(groupKey{"g0", "default"})
		return ok && off == 5
	})
}

// $offsets shows a group's committed offset and each change; publishing an
// offset there commits it, acknowledged once durable, and the group's
// consumer continues from it.
func TestOffsets_SubscribeAndSeek(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	store(t, s, topicsN("t", 0, 10), nil)
	b := newTestBroker(t, l)

	watcher := dialRaw(t, b, "watcher", 5)
	watcher.Subscribe("$offsets/g/default", 1)

	c := dialRaw(t, b, "consumer", 5)
	c.Subscribe("$group/g/+/t/#", 1)
	readPublishes(t, c, 10)
	// The watcher sees the offsets as they become durable, ending at 10.
	// A group that never committed has no offset yet: the first it sees
	// is a commit of the consumer's, never a 0 from before it.
	for first := true; ; first = false {
		pk := readPublishes(t, watcher, 1)[0]
		if pk.TopicName != "$offsets/g/default" {
			t.Fatalf("watcher got topic %q", pk.TopicName)
		}
		if first && string(pk.Payload) == "0" {
			t.Fatal("watcher got offset 0 for a group that never committed")
		}
		if string(pk.Payload) == "10" {
			break
		}
	}

	// Seek back to 4: the PUBACK comes once it is stored.
	admin := dialRaw(t, b, "admin", 5)
	admin.Publish("$offsets/g/default", 1, 1, "4")
	if ack := admin.ReadUntil(packets.Puback); ack.ReasonCode != 0 {
		t.Fatalf("commit PUBACK %#x %q", ack.ReasonCode, ack.Properties.ReasonString)
	}
	if off, _ := l.streamStateValue("default", "g/g"); string(off) != string(encodeOffset(4)) {
		t.Fatalf("stored offset %x, want 4", off)
	}
	if pk := readPublishes(t, watcher, 1)[0]; string(pk.Payload) != "4" {
		t.Fatalf("watcher got %q after the seek, want 4", pk.Payload)
	}
	// The connected consumer is taken back to 4.
	pks := readPublishes(t, c, 6)
	for i, pk := range pks {
		if off := offsetOf(t, pk.TopicName); off != 4+i {
			t.Fatalf("after seek, delivery %d has offset %d, want %d", i, off, 4+i)
		}
	}

	// Bad commits are refused with a reason, never acked.
	admin.Publish("$offsets/g/default", 1, 2, "soon")
	if ack := admin.ReadUntil(packets.Puback); ack.ReasonCode != packets.ErrPayloadFormatInvalid.Code {
		t.Fatalf("bad payload: PUBACK %#x, want 0x99", ack.ReasonCode)
	}
	admin.Publish("$offsets/g/nosuch", 1, 3, "1")
	if ack := admin.ReadUntil(packets.Puback); ack.ReasonCode != packets.ErrTopicNameInvalid.Code ||
		!strings.Contains(ack.Properties.ReasonString, "nosuch") {
		t.Fatalf("unknown stream: PUBACK %#x %q, want 0x90 naming it", ack.ReasonCode, ack.Properties.ReasonString)
	}
}

// Committed offsets are in the log's state store: a new broker over the
// same log resumes each group where it was.
func TestGroup_SurvivesABrokerRestart(t *testing.T) {
	l := newMemLog(t, "default=#")
	store(t, l.stream(t, "default"), topicsN("t", 0, 10), nil)
	b := newTestBroker(t, l)
	c := dialRaw(t, b, "c", 4)
	c.Subscribe("$group/g/+/#", 1)
	for i := range 10 {
		if pk := c.Read(); i < 6 {
			c.Puback(pk.PacketID)
		}
	}
	acksRead(t, c)
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}

	b2 := newTestBroker(t, l)
	c2 := dialRaw(t, b2, "c", 4)
	c2.Subscribe("$group/g/+/#", 1)
	if first := offsetOf(t, readPublishes(t, c2, 1)[0].TopicName); first != 6 {
		t.Fatalf("after restart the group starts at %d, want 6", first)
	}
}

// A client may replay only what its ACL lets it read: the filter inside
// $replay/ and $group/ is checked, not the extension topic.
func TestReplay_ACLAppliesToTheOriginalTopics(t *testing.T) {
	l := newMemLog(t, "default=#")
	store(t, l.stream(t, "default"), []string{"t/allowed/1", "t/secret/1"}, nil)
	b := newTestBroker(t, l, func(c *Config) {
		c.Auth = &testAuth{rules: []testRule{
			{client: "reader", filter: "t/allowed/#", read: true, allow: true},
			{client: "reader", filter: "t/#", read: true, allow: false},
		}}
	})
	r := dialRaw(t, b, "reader", 5)
	for _, f := range []string{"$replay/earliest/+/t/secret/#", "$group/g/+/t/secret/x"} {
		if ack := r.TrySubscribe(f, 1); ack.ReasonCodes[0] != subackNotAuthorized {
			t.Errorf("%s: SUBACK %#x %q, want 0x87", f, ack.ReasonCodes[0], ack.Properties.ReasonString)
		}
	}
	r.Subscribe("$replay/earliest/+/t/allowed/#", 1)
	if pk := readPublishes(t, r, 1)[0]; pk.TopicName != "$replay/earliest/0/t/allowed/1" {
		t.Fatalf("got %q", pk.TopicName)
	}
	// The next allowed record is the next delivery: t/secret/1, between
	// them in the log, was not delivered.
	expectNext(t, r, l.stream(t, "default"), "t/allowed/2")
}

// storedGroupOffset is the group's offset in its stream's state, "" when it
// has none.
func storedGroupOffset(l *memLog, group, stream string) string {
	ref := groupKey{group: group, stream: stream}.ref()
	v, ok := l.streamStateValue(ref.stream, ref.key)
	if !ok || len(v) != 8 {
		return ""
	}
	return strconv.FormatUint(binary.BigEndian.Uint64(v), 10)
}

// A commit published to $offsets must be a plain decimal offset no greater
// than the log's end. Anything else is refused with 0x99 and a reason (an
// MQTT 3 client is disconnected, as for every refused publish), and the
// group's committed offset does not move.
func TestOffsets_BadCommitsAreRefused(t *testing.T) {
	l := newMemLog(t, "default=#")
	store(t, l.stream(t, "default"), topicsN("t", 0, 2), nil) // the log end is 2
	b := newTestBroker(t, l)
	admin := dialRaw(t, b, "admin", 5)
	id := uint16(0)
	commit := func(payload string) packets.Packet {
		t.Helper()
		id++
		admin.Publish("$offsets/g/default", 1, id, payload)
		ack := admin.ReadUntil(packets.Puback)
		if ack.PacketID != id {
			t.Fatalf("PUBACK for id %d, want %d", ack.PacketID, id)
		}
		return ack
	}
	if ack := commit("1"); ack.ReasonCode != 0 {
		t.Fatalf("commit 1: PUBACK %#x %q", ack.ReasonCode, ack.Properties.ReasonString)
	}
	unchanged := func(what string) {
		t.Helper()
		if off := groupOffset(t, b, "g", "default"); off != 1 {
			t.Fatalf("%s: the group's offset moved to %d", what, off)
		}
		if got := storedGroupOffset(l, "g", "default"); got != "1" {
			t.Fatalf("%s: stored offset %q, want 1", what, got)
		}
	}
	cases := []struct{ payload, says string }{
		{"18446744073709551615", `beyond the end of stream "default" (2)`},
		{"999999", "beyond the end"},
		{"3", "commit at most 2"},
		{"18446744073709551616", "above the largest offset"},
		{"123456789012345678901", "1 to 20 digits"},
		{"", "1 to 20 digits"},
		{" 1", "plain decimal"},
		{"1 ", "plain decimal"},
		{"1\n", "plain decimal"},
		{"+1", "plain decimal"},
		{"-1", "plain decimal"},
		{"0x1", "plain decimal"},
		{"1e0", "plain decimal"},
		{"1.0", "plain decimal"},
		{"١", "plain decimal"}, // an Arabic-Indic digit
	}
	for _, tc := range cases {
		ack := commit(tc.payload)
		if ack.ReasonCode != packets.ErrPayloadFormatInvalid.Code || !strings.Contains(ack.Properties.ReasonString, tc.says) {
			t.Errorf("commit %q: PUBACK %#x %q, want 0x99 saying %q", tc.payload, ack.ReasonCode, ack.Properties.ReasonString, tc.says)
		}
		unchanged(fmt.Sprintf("after %q", tc.payload))
	}
	if v := metricValue(b.deliv.m.Refused.WithLabelValues(ReasonBadCommit)); v != float64(len(cases)) {
		t.Errorf("refused{bad_commit} = %v, want %d", v, len(cases))
	}

	// MQTT 3 has no negative PUBACK: the client is disconnected.
	for _, payload := range []string{" 1", "999999"} {
		v3 := dialRaw(t, b, "admin3", 4)
		v3.Publish("$offsets/g/default", 1, 1, payload)
		expectClosed(t, v3)
		unchanged(fmt.Sprintf("after MQTT 3 %q", payload))
	}

	// The log end itself means "consumed everything so far", and leading
	// zeros are still a plain decimal.
	if ack := commit("002"); ack.ReasonCode != 0 {
		t.Fatalf("commit of the log end: PUBACK %#x %q", ack.ReasonCode, ack.Properties.ReasonString)
	}
	if got := storedGroupOffset(l, "g", "default"); got != "2" {
		t.Fatalf("stored offset %q after committing the log end, want 2", got)
	}
}

// A commit below the log start (records retention removed) is stored as
// the log start, where the group reads from anyway, and $offsets shows it.
func TestOffsets_CommitBelowTheLogStartIsTheLogStart(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	store(t, s, topicsN("t", 0, 10), nil)
	s.trim(6)
	b := newTestBroker(t, l)
	admin := dialRaw(t, b, "admin", 5)
	admin.Publish("$offsets/g/default", 1, 1, "2")
	if ack := admin.ReadUntil(packets.Puback); ack.ReasonCode != 0 {
		t.Fatalf("commit below the log start: PUBACK %#x %q, want success", ack.ReasonCode, ack.Properties.ReasonString)
	}
	if got := storedGroupOffset(l, "g", "default"); got != "6" {
		t.Fatalf("stored offset %q, want the log start 6", got)
	}
	watcher := dialRaw(t, b, "watcher", 5)
	watcher.Subscribe("$offsets/g/default", 1)
	if pk := readPublishes(t, watcher, 1)[0]; string(pk.Payload) != "6" {
		t.Fatalf("$offsets shows %q, want 6", pk.Payload)
	}
	c := dialRaw(t, b, "consumer", 5)
	ack := c.Subscribe("$group/g/+/t/#", 1)
	if got, notice := userProp(ack.Properties, propStart), userProp(ack.Properties, propNotice); got != "6" || notice != "" {
		t.Fatalf("SUBACK start %q notice %q, want 6 and no notice", got, notice)
	}
	if off := offsetOf(t, readPublishes(t, c, 1)[0].TopicName); off != 6 {
		t.Fatalf("first delivery at offset %d, want 6", off)
	}
}

// boundsStream is a Stream whose only known facts are its bounds.
type boundsStream struct {
	Stream
	first, end uint64
}

func (s boundsStream) Name() string        { return "s" }
func (s boundsStream) FirstOffset() uint64 { return s.first }
func (s boundsStream) Committed() uint64   { return s.end }

// commitOffsetOf accepts exactly the plain decimals up to the log end, and
// stores those below the log start as the log start.
func FuzzCommitOffsetOf(f *testing.F) {
	for _, seed := range []string{"0", "3", "7", "10", "11", "007", " 1", "1 ", "+1", "-1", "0x1", "1e3", "",
		"18446744073709551615", "18446744073709551616", "١"} {
		f.Add([]byte(seed))
	}
	s := boundsStream{first: 3, end: 10}
	f.Fuzz(func(t *testing.T, payload []byte) {
		off, notice, err := commitOffsetOf(payload, s)
		plain := len(payload) > 0 && len(payload) <= maxOffsetDigits
		for _, b := range payload {
			plain = plain && b >= '0' && b <= '9'
		}
		v, perr := strconv.ParseUint(string(payload), 10, 64)
		valid := plain && perr == nil && v <= s.end
		if valid != (err == nil) {
			t.Fatalf("commitOffsetOf(%q) = %d, %v; valid %v", payload, off, err, valid)
		}
		if err != nil {
			if !errors.Is(err, errBadCommit) {
				t.Fatalf("commitOffsetOf(%q): %v does not wrap errBadCommit", payload, err)
			}
			return
		}
		if want := max(v, s.first); off != want || (notice != "") != (v < s.first) {
			t.Fatalf("commitOffsetOf(%q) = %d %q, want %d", payload, off, notice, want)
		}
	})
}
