package mqtt

import (
	"errors"
	"sync"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
)

// onSubscribedHook runs fn in mochi's OnSubscribed, after the delivery
// hook's (hooks run in the order added): between the moment a client's
// live delivery starts and the moment its retained messages are chosen.
type onSubscribedHook struct {
	mochi.HookBase
	fn func(cl *mochi.Client, pk packets.Packet)
}

func (k *onSubscribedHook) ID() string           { return "test-on-subscribed" }
func (k *onSubscribedHook) Provides(b byte) bool { return b == mochi.OnSubscribed }
func (k *onSubscribedHook) OnSubscribed(cl *mochi.Client, pk packets.Packet, _ []byte) {
	k.fn(cl, pk)
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
	waitFor(tb, "the marker record", func() bool { return countPayload(p.received(), marker) > 0 })
	p.subscribe(tb, "u/fence", 1)
	waitFor(tb, "mochi's retained fence", func() bool { return countPayload(p.received(), "fence") > 0 })
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
// before its retained messages are looked up reaches it once: it came to
// the client twice (flagged retained among the retained messages, and
// again live from the log) when mochi looked the retained messages up
// after the SUBACK in a store ingest had already updated.
func TestRetained_CommittedWhileSubscribingArrivesOnce(t *testing.T) {
	h := newDeliveryHarness(t, testDeliveryConfig(), "default=sensors/#")
	st := h.log.stream(t, "default")
	publishFence(t, h)

	var once sync.Once
	hookErr := make(chan error, 1)
	hook := &onSubscribedHook{fn: func(cl *mochi.Client, pk packets.Packet) {
		if cl.ID != "sub" || len(pk.Filters) == 0 || pk.Filters[0].Filter != "sensors/#" {
			return
		}
		once.Do(func() { hookErr <- appendAndApply(h, st, retainedRec("sensors/r", "late")) })
	}}
	if err := h.srv.AddHook(hook, nil); err != nil {
		t.Fatal(err)
	}
	sub := dialDlvPaho(t, h.addr, "sub")
	sub.subscribe(t, "sensors/#", 1)
	if err := <-hookErr; err != nil {
		t.Fatal(err)
	}
	h.appendRecs(t, "default", &logstore.Record{Topic: "sensors/end", Payload: []byte("end"), QoS: 1})
	got := settleSubscriber(t, sub, "end")
	if n := countPayload(got, "late"); n != 1 {
		t.Fatalf("the retained record committed while subscribing arrived %d times, want once: %+v", n, got)
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
