package mqtt

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// onSubscribedHook runs fn in mochi's OnSubscribed and before (when set)
// in OnSubscribe, after the delivery hook's (hooks run in the order
// added). OnSubscribed's comes between the moment mochi's delivery
// started a client live and the moment mochi looked its retained messages
// up; OnSubscribe's between the moment Peat pauses the client and the one
// it takes the snapshot.
type onSubscribedHook struct {
	mochi.HookBase
	fn     func(cl *mochi.Client, pk packets.Packet)
	before func(cl *mochi.Client, pk packets.Packet)
}

func (k *onSubscribedHook) ID() string { return "test-on-subscribed" }
func (k *onSubscribedHook) Provides(b byte) bool {
	return b == mochi.OnSubscribed || b == mochi.OnSubscribe && k.before != nil
}
func (k *onSubscribedHook) OnSubscribed(cl *mochi.Client, pk packets.Packet, _ []byte) {
	k.fn(cl, pk)
}
func (k *onSubscribedHook) OnSubscribe(cl *mochi.Client, pk packets.Packet) packets.Packet {
	k.before(cl, pk)
	return pk
}

// retainedApplied is the offset below which the stream's retained follower
// has applied every record.
func retainedApplied(d *delivery, stream string) uint64 {
	d.retained.mu.Lock()
	defer d.retained.mu.Unlock()
	return d.retained.mu.applied[stream]
}

// publishFence makes "u/fence", a topic no stream captures, a retained
// message of mochi's own (see settleSubscriber).
func publishFence(tb testing.TB, h *deliveryHarness) {
	tb.Helper()
	pub := dialDlvPaho(tb, h.addr, "fence-pub")
	if tok := pub.c.Publish("u/fence", 1, true, "fence"); !tok.WaitTimeout(deliveryWait) || tok.Error() != nil {
		tb.Fatalf("publish fence: %v", tok.Error())
	}
}

// settleSubscriber returns what p received once nothing sent for its
// earlier subscriptions can still be on the way: the record with payload
// marker (appended last, delivered from the log after everything of its
// stream before it), then mochi's retained "u/fence", which mochi queues
// behind any retained message it queued for an earlier SUBSCRIBE of this
// connection (one outbound queue per client, written in order).
func settleSubscriber(tb testing.TB, p *dlvPaho, marker string) []dlvMsg {
	tb.Helper()
	testwait.Eventually(tb, "the marker record", func() bool { return countPayload(p.received(), marker) > 0 })
	fences := countPayload(p.received(), "fence") // a filter like # has one already
	p.subscribe(tb, "u/fence", 1)
	testwait.Eventually(tb, "mochi's retained fence", func() bool { return countPayload(p.received(), "fence") > fences })
	return p.received()
}

func countPayload(msgs []dlvMsg, payload string) int {
	n := 0
	for _, m := range msgs {
		if m.payload == payload {
			n++
		}
	}
	return n
}

// A retained record committed after a client's live delivery started but
// before its retained messages are looked up reaches it once, live, after
// the topic's older retained message: it came to the client twice
// (flagged retained among the retained messages, and again live from the
// log) when mochi looked the retained messages up after the SUBACK in a
// store ingest had already updated, and the older value, when there was
// one, came after it. The same for a client's first subscription (it
// joins the streams' readers then) and a later one (it is a live member
// already).
func TestRetained_CommittedWhileSubscribingArrivesOnce(t *testing.T) {
	for _, later := range []bool{false, true} {
		name := map[bool]string{false: "first subscription", true: "later subscription"}[later]
		t.Run(name, func(t *testing.T) {
			h := newDeliveryHarness(t, testDeliveryConfig(), "default=sensors/#")
			st := h.log.stream(t, "default")
			publishFence(t, h)
			h.appendRecs(t, "default", retainedRec("sensors/r", "early"))

			var once, onceBefore sync.Once
			hookErr := make(chan error, 2)
			ours := func(cl *mochi.Client, pk packets.Packet) bool {
				return cl.ID == "sub" && len(pk.Filters) > 0 && pk.Filters[0].Filter == "sensors/#"
			}
			hook := &onSubscribedHook{fn: func(cl *mochi.Client, pk packets.Packet) {
				if ours(cl, pk) {
					once.Do(func() { hookErr <- appendAndApply(h, st, retainedRec("sensors/r", "late")) })
				}
			}, before: func(cl *mochi.Client, pk packets.Packet) {
				// Committed after the client was paused and before its
				// snapshot is taken: among its retained messages, and left
				// out of what its cursor reads after the pause.
				if ours(cl, pk) {
					onceBefore.Do(func() { hookErr <- appendAndApply(h, st, retainedRec("sensors/b", "between")) })
				}
			}}
			if err := h.srv.AddHook(hook, nil); err != nil {
				t.Fatal(err)
			}
			sub := dialDlvPaho(t, h.addr, "sub")
			if later {
				sub.subscribe(t, "sensors/other/#", 1)
				h.appendRecs(t, "default", &logstore.Record{Topic: "sensors/other/x", Payload: []byte("before"), QoS: 1})
				testwait.Eventually(t, "a live record of the first subscription", func() bool { return countPayload(sub.received(), "before") > 0 })
			}
			sub.subscribe(t, "sensors/#", 1)
			for range 2 {
				if err := <-hookErr; err != nil {
					t.Fatal(err)
				}
			}
			h.appendRecs(t, "default", &logstore.Record{Topic: "sensors/end", Payload: []byte("end"), QoS: 1})
			got := settleSubscriber(t, sub, "end")
			var r []dlvMsg
			for _, m := range got {
				if m.topic == "sensors/r" {
					r = append(r, m)
				}
			}
			want := []dlvMsg{
				{topic: "sensors/r", payload: "early", qos: 1, retain: true},
				{topic: "sensors/r", payload: "late", qos: 1, retain: false},
			}
			if !slices.Equal(r, want) {
				t.Fatalf("sensors/r arrived as %+v, want the retained early then the live late once each (all: %+v)", r, got)
			}
			var b []dlvMsg
			for _, m := range got {
				if m.topic == "sensors/b" {
					b = append(b, m)
				}
			}
			if want := []dlvMsg{{topic: "sensors/b", payload: "between", qos: 1, retain: true}}; !slices.Equal(b, want) {
				t.Fatalf("sensors/b arrived as %+v, want once, retained (all: %+v)", b, got)
			}
		})
	}
}

// appendAndApply appends rec and waits until the retained follower has
// applied it: the retained set then holds it. It runs on mochi's client
// goroutine, so it returns its failure instead of failing the test.
func appendAndApply(h *deliveryHarness, st *memStream, rec *logstore.Record) error {
	done := make(chan error, 1)
	var first uint64
	st.AppendAsync([]*logstore.Record{rec}, func(off uint64, err error) {
		first = off
		done <- err
	})
	deadline := time.Now().Add(deliveryWait)
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-time.After(deliveryWait):
		return errors.New("append not committed")
	}
	for retainedApplied(h.d, st.Name()) <= first {
		if time.Now().After(deadline) {
			return errors.New("retained follower did not apply the record")
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// A retained record committed before a client subscribes reaches it once,
// flagged retained, even when the retained follower has not read it yet
// (a busy node, or a follower replica whose log just advanced): it reached
// the client neither among the retained messages (not applied yet) nor
// live (below where the client's live delivery started).
func TestRetained_CommittedBeforeSubscribingArrivesOnceWhileFollowerLags(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "default=sensors/#")
	st := h.log.stream(t, "default")
	publishFence(t, h)
	sub := dialDlvPaho(t, h.addr, "sub")

	resume := st.stallReads(t)
	h.appendRecs(t, "default", retainedRec("sensors/r", "kept"))
	sub.subscribe(t, "sensors/#", 1)
	resume()
	h.appendRecs(t, "default", &logstore.Record{Topic: "sensors/end", Payload: []byte("end"), QoS: 1})

	got := settleSubscriber(t, sub, "end")
	var kept []dlvMsg
	for _, m := range got {
		if m.payload == "kept" {
			kept = append(kept, m)
		}
	}
	if len(kept) != 1 || !kept[0].retain {
		t.Fatalf("the retained record committed before subscribing arrived as %+v, want once, flagged retained (all: %+v)", kept, got)
	}
}

// subscribeV5 subscribes raw to sub with packet id id and waits for its
// SUBACK; the reason code is returned.
func subscribeV5(tb testing.TB, raw *mqtttest.Raw, id uint16, sub packets.Subscription) byte {
	tb.Helper()
	raw.Write(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID:    id,
		Filters:     packets.Subscriptions{sub},
	})
	ack := raw.ReadUntil(packets.Suback)
	if len(ack.ReasonCodes) != 1 {
		tb.Fatalf("SUBACK with %d reason codes", len(ack.ReasonCodes))
	}
	return ack.ReasonCodes[0]
}

// publishesUntil appends a record with payload marker and returns the
// PUBLISHes raw reads before it (QoS 0 subscriptions: nothing to
// acknowledge). Everything sent for the subscriptions made before comes
// first: their retained messages are queued before their live records.
func publishesUntil(tb testing.TB, h *deliveryHarness, raw *mqtttest.Raw, marker string) []packets.Packet {
	tb.Helper()
	h.appendRecs(tb, "default", &logstore.Record{Topic: "sensors/end", Payload: []byte(marker)})
	var out []packets.Packet
	for {
		pk := raw.Read()
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if string(pk.Payload) == marker {
			return out
		}
		out = append(out, pk)
	}
}

// MQTT 5 subscription options decide which subscriptions get the retained
// messages of captured topics, as for mochi's own: Retain Handling 0
// always, 1 only for a new subscription, 2 never; shared subscriptions
// never. What they get is flagged retained, whatever Retain As Published
// says; a live record keeps its flag only with Retain As Published.
func TestRetained_SubscriptionOptions(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "default=sensors/#")
	h.appendRecs(t, "default", retainedRec("sensors/r", "kept"))
	raw := dialDlvRaw(t, h.addr, "v5", 5, packets.Properties{})

	steps := []struct {
		name string
		sub  packets.Subscription
		want int // copies of "kept"
	}{
		{"retain handling 2", packets.Subscription{Filter: "sensors/#", RetainHandling: 2}, 0},
		{"retain handling 1, new", packets.Subscription{Filter: "sensors/+", RetainHandling: 1}, 1},
		{"retain handling 1, existing", packets.Subscription{Filter: "sensors/+", RetainHandling: 1}, 0},
		{"retain handling 0, existing", packets.Subscription{Filter: "sensors/+"}, 1},
		{"retain as published", packets.Subscription{Filter: "sensors/r", RetainAsPublished: true}, 1},
	}
	for i, step := range steps {
		if code := subscribeV5(t, raw, uint16(100+i), step.sub); code != 0 {
			t.Fatalf("%s: SUBACK reason %#x", step.name, code)
		}
		pubs := publishesUntil(t, h, raw, fmt.Sprintf("end%d", i))
		n := 0
		for _, pk := range pubs {
			if string(pk.Payload) != "kept" {
				continue
			}
			n++
			if !pk.FixedHeader.Retain {
				t.Errorf("%s: a retained message without its retain flag", step.name)
			}
		}
		if n != step.want {
			t.Errorf("%s: got the retained message %d times, want %d (%d publishes)", step.name, n, step.want, len(pubs))
		}
	}

	h.appendRecs(t, "default", retainedRec("sensors/r", "live"))
	pubs := publishesUntil(t, h, raw, "end-live")
	if len(pubs) != 1 || string(pubs[0].Payload) != "live" || !pubs[0].FixedHeader.Retain {
		t.Fatalf("a live retained record for a Retain As Published subscription: %+v, want it once, flag kept", pubs)
	}

	shared := dialDlvRaw(t, h.addr, "shared", 5, packets.Properties{})
	if code := subscribeV5(t, shared, 100, packets.Subscription{Filter: "$share/g/sensors/#"}); code != 0 {
		t.Fatalf("shared: SUBACK reason %#x", code)
	}
	if pubs := publishesUntil(t, h, shared, "end-shared"); len(pubs) != 0 {
		t.Fatalf("a shared subscription got %d retained messages, want none", len(pubs))
	}
}

// A subscription with No Local does not get the retained message its own
// client published, as mochi does not send one [MQTT-3.8.3-3].
func TestRetained_NoLocal(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "default=sensors/#")
	rec := retainedRec("sensors/own", "own")
	rec.ClientID = "v5"
	h.appendRecs(t, "default", rec, retainedRec("sensors/other", "other"))
	raw := dialDlvRaw(t, h.addr, "v5", 5, packets.Properties{})
	if code := subscribeV5(t, raw, 100, packets.Subscription{Filter: "sensors/#", NoLocal: true}); code != 0 {
		t.Fatalf("SUBACK reason %#x", code)
	}
	pubs := publishesUntil(t, h, raw, "end")
	if len(pubs) != 1 || string(pubs[0].Payload) != "other" {
		t.Fatalf("No Local subscription got %d retained messages (%v), want only other's", len(pubs), pubs)
	}
}

// Through the whole broker (ingest, log, follower, delivery), subscribers
// that subscribe while a topic's retained value keeps changing each see
// one unbroken run of values: at most one flagged retained, then every
// later one live, each once, in order. A value twice, a gap or a step
// back is what a user would notice; the race this guards against lies
// between OnSubscribed and mochi's look-up, so a broker with it fails
// here only sometimes (the deterministic tests above always).
func TestRetained_SubscribersDuringRetainedPublishes(t *testing.T) {
	const values, subscribers = 150, 8
	l := newMemLog(t, "default=#")
	b := newTestBroker(t, l)
	pub, _ := dialV3(t, b, "pub")

	type msg struct {
		v      int
		retain bool
	}
	type recv struct {
		mu   sync.Mutex
		msgs []msg
	}
	got := make([]*recv, subscribers)
	published := make(chan error, 1)
	go func() {
		for i := range values {
			tok := pub.Publish("sensors/r", 1, true, strconv.Itoa(i))
			if !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
				published <- fmt.Errorf("publish %d: %v", i, tok.Error())
				return
			}
		}
		published <- nil
	}()
	for i := range subscribers {
		r := &recv{}
		got[i] = r
		sub, _ := dialV3(t, b, fmt.Sprintf("sub%d", i))
		if tok := sub.Subscribe("sensors/#", 1, func(_ paho.Client, m paho.Message) {
			v, _ := strconv.Atoi(string(m.Payload()))
			r.mu.Lock()
			r.msgs = append(r.msgs, msg{v, m.Retained()})
			r.mu.Unlock()
		}); !tok.WaitTimeout(waitLimit) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	for i, r := range got {
		testwait.Eventually(t, fmt.Sprintf("sub%d to get the last value", i), func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return len(r.msgs) > 0 && r.msgs[len(r.msgs)-1].v >= values-1
		})
		r.mu.Lock()
		msgs := slices.Clone(r.msgs)
		r.mu.Unlock()
		for j, m := range msgs {
			switch {
			case j > 0 && m.v != msgs[j-1].v+1:
				t.Fatalf("sub%d: value %d after %d (a duplicate, a gap or a step back): %v", i, m.v, msgs[j-1].v, msgs)
			case j > 0 && m.retain:
				t.Fatalf("sub%d: value %d flagged retained after the first message: %v", i, m.v, msgs)
			}
		}
	}
}

// A filter that reaches two streams gets each stream's retained messages
// once, with the start of its live records fixed per stream.
func TestRetained_FilterOverTwoStreams(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "a=sensors/#", "b=meters/#")
	sa, sb := h.log.stream(t, "a"), h.log.stream(t, "b")
	publishFence(t, h)
	h.appendRecs(t, "a", retainedRec("sensors/r", "a-early"))
	h.appendRecs(t, "b", retainedRec("meters/r", "b-early"))

	var once, onceBefore sync.Once
	hookErr := make(chan error, 4)
	hook := &onSubscribedHook{fn: func(cl *mochi.Client, _ packets.Packet) {
		if cl.ID == "sub" {
			once.Do(func() {
				hookErr <- appendAndApply(h, sa, retainedRec("sensors/r", "a-late"))
				hookErr <- appendAndApply(h, sb, retainedRec("meters/r", "b-late"))
			})
		}
	}, before: func(cl *mochi.Client, _ packets.Packet) {
		if cl.ID == "sub" {
			onceBefore.Do(func() {
				hookErr <- appendAndApply(h, sa, retainedRec("sensors/b", "a-between"))
				hookErr <- appendAndApply(h, sb, retainedRec("meters/b", "b-between"))
			})
		}
	}}
	if err := h.srv.AddHook(hook, nil); err != nil {
		t.Fatal(err)
	}
	sub := dialDlvPaho(t, h.addr, "sub")
	sub.subscribe(t, "#", 1)
	for range 4 {
		if err := <-hookErr; err != nil {
			t.Fatal(err)
		}
	}
	h.appendRecs(t, "a", &logstore.Record{Topic: "sensors/end", Payload: []byte("a-end"), QoS: 1})
	h.appendRecs(t, "b", &logstore.Record{Topic: "meters/end", Payload: []byte("b-end"), QoS: 1})
	testwait.Eventually(t, "the marker of a", func() bool { return countPayload(sub.received(), "a-end") > 0 })
	got := settleSubscriber(t, sub, "b-end")
	want := map[string]bool{ // payload: flagged retained
		"a-early": true, "a-between": true, "a-late": false,
		"b-early": true, "b-between": true, "b-late": false,
	}
	for payload, retain := range want {
		var seen []dlvMsg
		for _, m := range got {
			if m.payload == payload {
				seen = append(seen, m)
			}
		}
		if len(seen) != 1 || seen[0].retain != retain {
			t.Errorf("%s arrived as %+v, want once with retain %v", payload, seen, retain)
		}
	}
}
