package mqtt

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// retainedPayloads returns the retained messages of captured topics
// matching filter that b holds.
func retainedPayloads(b *Broker, filter string) []string {
	return setPayloads(b.deliv.retained, filter)
}

func setPayloads(rs *retainedSet, filter string) []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []string
	rs.mu.index.Match(filter, func(topic string) {
		if e, ok := rs.mu.topics[topic]; ok {
			out = append(out, string(e.rec.Payload))
		}
	})
	return out
}

// appendDirect appends recs to the stream as a follower replica receives
// them: not through this broker's ingest. It waits for the commit.
func appendDirect(tb testing.TB, st Stream, recs ...*logstore.Record) uint64 {
	tb.Helper()
	type res struct {
		first uint64
		err   error
	}
	ch := make(chan res, 1)
	st.AppendAsync(recs, func(first uint64, err error) { ch <- res{first, err} })
	r := <-ch
	if r.err != nil {
		tb.Fatalf("append: %v", r.err)
	}
	return r.first
}

func retainedRec(topic, payload string) *logstore.Record {
	return &logstore.Record{Topic: topic, Payload: []byte(payload), QoS: 1, Retain: true}
}

// restartBroker closes b and starts a new broker on the same log, as a
// node restarted on its log would: the new mochi server starts empty.
func restartBroker(tb testing.TB, b *Broker, l Log) *Broker {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		tb.Fatalf("close: %v", err)
	}
	return newTestBroker(tb, l)
}

// subscribeRetained subscribes a new client to filter and returns the
// first message it gets, which must come flagged retained.
func subscribeRetained(tb testing.TB, b *Broker, id, filter string) paho.Message {
	tb.Helper()
	sub, _ := dialV3(tb, b, id)
	got := make(chan paho.Message, 1)
	if tok := sub.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) {
		select {
		case got <- m:
		default:
		}
	}); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
		tb.Fatalf("subscribe: %v", tok.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	select {
	case m := <-got:
		if !m.Retained() {
			tb.Fatalf("%s got %q on %s not flagged retained", id, m.Payload(), m.Topic())
		}
		return m
	case <-ctx.Done():
		tb.Fatalf("%s got no retained message on %s", id, filter)
		return nil
	}
}

// A retained record that reaches the log without this broker's ingest (a
// follower replica's append) is a retained message for new subscribers;
// an empty retained payload appended the same way clears it.
func TestRetained_FromCommittedLog(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)

	appendDirect(t, st, &logstore.Record{Topic: "sensors/x", Payload: []byte("plain"), QoS: 1})
	appendDirect(t, st, retainedRec("sensors/r", "from-leader"))
	testwait.Eventually(t, "retained message from the log", func() bool {
		m := retainedPayloads(b, "sensors/r")
		return len(m) == 1 && m[0] == "from-leader"
	})
	if m := subscribeRetained(t, b, "sub", "sensors/#"); string(m.Payload()) != "from-leader" || m.Topic() != "sensors/r" {
		t.Fatalf("new subscriber got %q on %s, want from-leader on sensors/r", m.Payload(), m.Topic())
	}
	if m := retainedPayloads(b, "sensors/x"); len(m) != 0 {
		t.Fatalf("a record without Retain became retained: %v", m)
	}

	appendDirect(t, st, retainedRec("sensors/r", ""))
	testwait.Eventually(t, "retained message cleared by an empty payload", func() bool {
		return len(retainedPayloads(b, "sensors/r")) == 0
	})
}

// A broker started on a log that holds retained records has their retained
// messages at once, without a publish, from the index alone; cleared
// topics stay cleared.
func TestRetained_RestartRebuildsFromLog(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	pub, _ := dialV3(t, b, "pub")
	publish := func(topic, payload string) {
		t.Helper()
		if tok := pub.Publish(topic, 1, true, payload); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	publish("sensors/a", "a1")
	publish("sensors/a", "a2")
	publish("sensors/b", "b1")
	publish("sensors/b", "") // cleared
	if r := st.records(); len(r) != 4 {
		t.Fatalf("log holds %d records, want 4", len(r))
	}

	b = restartBroker(t, b, l)
	for topic, want := range map[string]string{"sensors/a": "a2", "sensors/b": ""} {
		got := retainedPayloads(b, topic)
		if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != want) {
			t.Errorf("after restart, retained %s = %v, want %q", topic, got, want)
		}
	}
	if m := subscribeRetained(t, b, "sub", "sensors/a"); string(m.Payload()) != "a2" {
		t.Fatalf("new subscriber after restart got %q, want a2", m.Payload())
	}
	// The index holds one entry per retained topic, not one per record.
	n := 0
	if err := l.State().LoadState(retainedTopicPrefix("default"), func(string, []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("retained index has %d entries, want 1 (sensors/a)", n)
	}
}

// Retention takes a record's retained message with it: at once on a
// running broker, and after a restart.
func TestRetained_DroppedByRetention(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	appendDirect(t, st, retainedRec("sensors/old", "old"))
	appendDirect(t, st, retainedRec("sensors/kept", "kept"))
	testwait.Eventually(t, "both retained", func() bool {
		return len(retainedPayloads(b, "sensors/old")) == 1 && len(retainedPayloads(b, "sensors/kept")) == 1
	})

	st.trim(1) // retention removes offset 0
	testwait.Eventually(t, "the removed record's retained message gone", func() bool {
		return len(retainedPayloads(b, "sensors/old")) == 0
	})

	b = restartBroker(t, b, l)
	if m := retainedPayloads(b, "sensors/old"); len(m) != 0 {
		t.Fatalf("after restart a record retention removed is retained: %v", m)
	}
	if m := retainedPayloads(b, "sensors/kept"); len(m) != 1 || m[0] != "kept" {
		t.Fatalf("after restart sensors/kept retained = %v, want kept", m)
	}
}

// Retention that happens while the broker is down: the restarted broker
// has no retained message for a record it removed.
func TestRetained_DroppedByRetentionWhileDown(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	appendDirect(t, st, retainedRec("sensors/old", "old"))
	appendDirect(t, st, retainedRec("sensors/kept", "kept"))
	testwait.Eventually(t, "both retained", func() bool {
		return len(retainedPayloads(b, "sensors/old")) == 1 && len(retainedPayloads(b, "sensors/kept")) == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st.trim(1)
	b = newTestBroker(t, l)
	if m := retainedPayloads(b, "sensors/old"); len(m) != 0 {
		t.Fatalf("after restart a record retention removed is retained: %v", m)
	}
	if m := retainedPayloads(b, "sensors/kept"); len(m) != 1 || m[0] != "kept" {
		t.Fatalf("after restart sensors/kept retained = %v, want kept", m)
	}
}

// A retained publish whose append is refused never becomes retained: not
// on the broker that took it, not after the follower passed, not after a
// restart.
func TestRetained_RefusedAppendNeverRetained(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)

	st.fail(errors.New("disk gone"))
	pub := dialRaw(t, b, "pub5", 5)
	pub.Write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
		TopicName: "sensors/refused", PacketID: 1, Payload: []byte("never")})
	if pk := pub.Read(); pk.ReasonCode < 0x80 {
		t.Fatalf("publish acked while the log fails")
	}
	refused := make(chan error, 1)
	st.AppendAsync([]*logstore.Record{retainedRec("sensors/refused", "never either")}, func(_ uint64, err error) { refused <- err })
	if err := <-refused; err == nil {
		t.Fatal("append succeeded while the log fails")
	}
	st.fail(nil)

	appendDirect(t, st, retainedRec("sensors/marker", "m"))
	testwait.Eventually(t, "the follower past the refused appends", func() bool {
		return len(retainedPayloads(b, "sensors/marker")) == 1
	})
	if m := retainedPayloads(b, "sensors/refused"); len(m) != 0 {
		t.Fatalf("a refused retained publish is retained: %v", m)
	}
	b = restartBroker(t, b, l)
	if m := retainedPayloads(b, "sensors/refused"); len(m) != 0 {
		t.Fatalf("after restart a refused retained publish is retained: %v", m)
	}
	if m := retainedPayloads(b, "sensors/marker"); len(m) != 1 {
		t.Fatalf("after restart sensors/marker retained = %v, want m", m)
	}
}

// A log whose retained index was never written (a broker from before the
// index, or one that crashed before its first store) is read from its
// start: its retained messages come back without a publish.
func TestRetained_NoIndexReadsTheLog(t *testing.T) {
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	appendDirect(t, st, retainedRec("sensors/a", "a1"))
	appendDirect(t, st, &logstore.Record{Topic: "sensors/a", Payload: []byte("live"), QoS: 1})
	b := newTestBroker(t, l)
	testwait.Eventually(t, "retained message read from the log's start", func() bool {
		m := retainedPayloads(b, "sensors/a")
		return len(m) == 1 && m[0] == "a1"
	})
}

// writeStateChunks splits what does not fit one WriteState and writes the
// last key in the last step.
func TestRetained_WriteStateChunks(t *testing.T) {
	l := newMemLog(t, "default=#")
	puts := map[string][]byte{}
	for i := range 1500 {
		puts[fmt.Sprintf("p/%04d", i)] = []byte{1}
	}
	var dels []string
	for i := range 700 {
		dels = append(dels, fmt.Sprintf("d/%04d", i))
	}
	if err := l.State().WriteState(map[string][]byte{"d/0000": {1}, "d/0699": {1}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := writeStateChunks(l.State(), puts, dels, "z/last", []byte{2}); err != nil {
		t.Fatalf("writeStateChunks: %v", err)
	}
	n := 0
	if err := l.State().LoadState("p/", func(string, []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 1500 {
		t.Fatalf("%d puts stored, want 1500", n)
	}
	if _, ok := l.stateValue("d/0699"); ok {
		t.Fatal("a deleted key is still there")
	}
	if v, ok := l.stateValue("z/last"); !ok || v[0] != 2 {
		t.Fatal("last key not stored")
	}
}

// A snapshot holds exactly the retained records below its offset, even
// when the follower applies records at and above it in the same batch:
// those reach the subscriber live.
func TestRetained_SnapshotAtItsOffset(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	rs := newRetainedSet(b.Server(), l.State(), b.logger)
	apply := func(next uint64, recs ...*logstore.Record) {
		puts, dels := map[string][]byte{}, []string(nil)
		rs.mu.Lock()
		rs.applyLocked("other", recs, next, puts, &dels)
		rs.mu.Unlock()
	}
	at := func(off uint64, topic, payload string) *logstore.Record {
		rec := retainedRec(topic, payload)
		rec.Offset = off
		return rec
	}
	apply(4, at(3, "other/r", "v3"))
	snap := &retainedSnapshot{stream: "other", filter: "other/#", at: 6, ready: make(chan struct{})}
	rs.mu.Lock()
	rs.mu.waiting["other"] = []*retainedSnapshot{snap}
	rs.mu.Unlock()
	apply(5, at(4, "other/q", "q4"))
	select {
	case <-snap.ready:
		t.Fatal("snapshot at 6 handed over with the follower at 5")
	default:
	}
	apply(9, at(5, "other/r", "v5"), at(6, "other/r", "v6"), at(7, "other/q", ""), at(8, "other/s", "s8"))
	<-snap.ready
	got := map[string]string{}
	for _, rec := range snap.recs {
		got[rec.Topic] = string(rec.Payload)
	}
	if want := map[string]string{"other/r": "v5", "other/q": "q4"}; !maps.Equal(got, want) {
		t.Fatalf("snapshot at 6 = %v, want %v", got, want)
	}
	if m := setPayloads(rs, "other/#"); len(m) != 2 {
		t.Fatalf("after the batch the set holds %v, want v6 and s8", m)
	}
}

// A stream added at run time has a retained follower of its own: a
// retained record appended to it directly (as a replica receives it)
// becomes the topic's retained message.
func TestRetained_StreamAddedAtRunTime(t *testing.T) {
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	if _, err := l.ml.AddStream("sensors=sensors/#"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "delivery to read the added stream", func() bool { return b.deliv.reader("sensors") != nil })
	appendDirect(t, l.stream(t, "sensors"), retainedRec("sensors/r", "added"))
	testwait.Eventually(t, "retained message from the added stream", func() bool {
		m := retainedPayloads(b, "sensors/r")
		return len(m) == 1 && m[0] == "added"
	})
}

// A removed stream's retained messages and index go with it.
func TestRetained_StreamRemovedAtRunTime(t *testing.T) {
	l := newMemLog(t, "default=#", "sensors=sensors/#")
	b := newTestBroker(t, l)
	appendDirect(t, l.stream(t, "sensors"), retainedRec("sensors/r", "gone soon"))
	appendDirect(t, l.stream(t, "default"), retainedRec("other/r", "stays"))
	testwait.Eventually(t, "the retained messages and their index", func() bool {
		_, indexed := l.stateValue(retainedTopicKey("sensors", "sensors/r"))
		return len(retainedPayloads(b, "sensors/r")) == 1 && len(retainedPayloads(b, "other/r")) == 1 && indexed
	})
	if err := l.ml.RemoveStream("sensors"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "the removed stream's retained message to go", func() bool {
		return len(retainedPayloads(b, "sensors/r")) == 0
	})
	if _, ok := l.stateValue(retainedTopicKey("sensors", "sensors/r")); ok {
		t.Error("the removed stream's retained index entry is still stored")
	}
	if _, ok := l.stateValue(retainedPosKey("sensors")); ok {
		t.Error("the removed stream's retained position is still stored")
	}
	if m := retainedPayloads(b, "other/r"); len(m) != 1 || m[0] != "stays" {
		t.Errorf("another stream's retained message: %q, want stays", m)
	}
}

// A log truncated below what the retained follower applied (an unclean
// leader election) takes back the retained messages of the records it
// dropped; records written at those offsets again are followed.
func TestRetained_TruncatedLog(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	b := newTestBroker(t, l)
	appendDirect(t, s, retainedRec("a/r", "kept"), retainedRec("b/r", "dropped"))
	testwait.Eventually(t, "both retained", func() bool {
		return len(retainedPayloads(b, "a/r")) == 1 && len(retainedPayloads(b, "b/r")) == 1
	})
	s.Truncate(1)
	testwait.Eventually(t, "the truncated record's retained message to go", func() bool {
		return len(retainedPayloads(b, "b/r")) == 0
	})
	if m := retainedPayloads(b, "a/r"); len(m) != 1 || m[0] != "kept" {
		t.Fatalf("retained below the truncation: %q, want kept", m)
	}
	if off := appendDirect(t, s, retainedRec("c/r", "again")); off != 1 {
		t.Fatalf("append after truncation at %d, want 1", off)
	}
	testwait.Eventually(t, "the record written again at offset 1 to be retained", func() bool {
		m := retainedPayloads(b, "c/r")
		return len(m) == 1 && m[0] == "again"
	})
	testwait.Eventually(t, "the index to follow", func() bool {
		_, gone := l.stateValue(retainedTopicKey("default", "b/r"))
		v, ok := l.stateValue(retainedTopicKey("default", "c/r"))
		return !gone && ok && string(v) == string(encodeOffset(1))
	})
}
