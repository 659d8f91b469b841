package mqtt

import (
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// reader returns the delivery reader of a stream.
func (h *deliveryHarness) reader(tb testing.TB, stream string) *deliveryReader {
	tb.Helper()
	h.d.mu.RLock()
	defer h.d.mu.RUnlock()
	for _, r := range h.d.mu.readers {
		if r.stream.Name() == stream {
			return r
		}
	}
	tb.Fatalf("no reader for %s", stream)
	return nil
}

// waitDispatched waits until the shared reader of stream has dispatched
// every committed record.
func (h *deliveryHarness) waitDispatched(tb testing.TB, stream string) {
	tb.Helper()
	r := h.reader(tb, stream)
	testwait.Eventually(tb, "the shared reader to dispatch everything", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.mu.dispatched == r.stream.Committed()
	})
}

// live reports whether client id is on the shared reader of stream.
func (h *deliveryHarness) live(tb testing.TB, stream, id string) bool {
	r := h.reader(tb, stream)
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mu.members[id]
	return m != nil && m.live
}

// appendPadded appends n records numbered from first, payloads padded to
// size bytes, in batches.
func (h *deliveryHarness) appendPadded(tb testing.TB, stream, topic string, qos byte, first, n, size int) {
	tb.Helper()
	const batch = 500
	for i := first; i < first+n; i += batch {
		var recs []*logstore.Record
		for j := i; j < min(i+batch, first+n); j++ {
			p := fmt.Appendf(nil, "%d ", j)
			if len(p) < size {
				p = append(p, strings.Repeat("x", size-len(p))...)
			}
			recs = append(recs, &logstore.Record{Topic: topic, Payload: p, QoS: qos})
		}
		h.appendRecs(tb, stream, recs...)
	}
}

// seqOf parses the record number at the start of a payload.
func seqOf(tb testing.TB, payload []byte) int {
	tb.Helper()
	s, _, _ := strings.Cut(string(payload), " ")
	n, err := strconv.Atoi(s)
	if err != nil {
		tb.Fatalf("payload %q: %v", payload, err)
	}
	return n
}

// readInOrder reads PUBLISHes, acknowledging QoS 1 ones, and checks that
// they carry the record numbers from, from+1, ... until it has n.
func readInOrder(tb testing.TB, c *mqtttest.Raw, from, n int) {
	tb.Helper()
	for want := from; want < from+n; want++ {
		pk := c.ReadUntil(packets.Publish)
		if got := seqOf(tb, pk.Payload); got != want {
			tb.Fatalf("got record %d, want %d: a record was lost, repeated or reordered", got, want)
		}
		if pk.FixedHeader.Qos > 0 {
			c.Puback(pk.PacketID)
		}
	}
}

func TestDelivery_SlowQoS1SubscriberLosesNothing(t *testing.T) {
	cfg := testDeliveryConfig()
	cfg.QueueDepth, cfg.SendWindow, cfg.ReadBatch = 8, 16, 64
	h := newDeliveryHarness(t, cfg, "default=#")
	slow := dialDlvRaw(t, h.addr, "slow", 4, packets.Properties{})
	slow.Subscribe("s/#", 1)
	fast := dialDlvPaho(t, h.addr, "fast")
	fast.subscribe(t, "s/#", 1)

	// The slow client reads nothing yet: its window and queue fill, and it
	// must fall back to its own cursor instead of losing records or
	// holding them all in memory.
	const n = 5000
	h.appendPadded(t, "default", "s/x", 1, 0, n, 64)
	testwait.Eventually(t, "the slow subscriber to fall back to its own cursor", func() bool { return h.catchups() > 0 })
	if h.live(t, "default", "slow") {
		t.Fatal("slow subscriber still on the shared reader")
	}
	fast.waitCount(t, n) // the others are not held up

	readInOrder(t, slow, 0, n)
	testwait.Eventually(t, "the slow subscriber to rejoin the shared reader", func() bool { return h.live(t, "default", "slow") })

	// Live again: new records arrive, continuing the sequence.
	h.appendPadded(t, "default", "s/x", 1, n, 10, 64)
	readInOrder(t, slow, n, 10)
	if got := h.dropped(ReasonSlowQoS0) + h.dropped(ReasonOutOfRetain); got != 0 {
		t.Fatalf("dropped %v, want 0", got)
	}
	if got := metricValue(h.m.Delivered.WithLabelValues("default")); got < 2*n {
		t.Fatalf("delivered metric %v, want at least %d", got, 2*n)
	}
}

// A QoS 0 subscriber that stops reading loses the records that fall more
// than QoS0MaxLag behind the log's end, and each one is counted when it is
// dropped, while the subscriber is still stalled, not when (or if) it
// reads again. Once it reads, what it gets plus what was counted is every
// record, exactly.
func TestDelivery_SlowQoS0SubscriberDropsAreCounted(t *testing.T) {
	cfg := testDeliveryConfig()
	const queue, maxLag = 8, 100
	cfg.QueueDepth, cfg.QoS0MaxLag = queue, maxLag
	h := newDeliveryHarness(t, cfg, "default=#")
	slow := dialDlvRaw(t, h.addr, "slow0", 4, packets.Properties{})
	slow.Subscribe("s/#", 0)
	// Small socket buffers on both ends bound what can be in flight to it.
	type buffered interface{ SetReadBuffer(int) error }
	if tc, ok := slow.Conn().(buffered); ok {
		_ = tc.SetReadBuffer(4096)
	}
	cl, ok := h.srv.Clients.Get("slow0")
	if !ok {
		t.Fatal("slow0 is not connected")
	}
	if wc, ok := cl.Net.Conn.(interface{ SetWriteBuffer(int) error }); ok {
		_ = wc.SetWriteBuffer(4096)
	}

	// The subscriber reads nothing while 6000 records of 2 KiB are
	// appended: its queue and socket fill after a few records, and the
	// log's end runs far ahead of it.
	const n, size = 6000, 2048
	h.appendPadded(t, "default", "s/x", 1, 0, n, size)
	// Everything more than maxLag behind the end is lost to it, except the
	// few records already queued or in the sockets: those are counted now.
	// (inFlight bounds those: the queue, the sender's burst, two 4 KiB
	// socket buffers that the kernel doubles, with room to spare.)
	const inFlight = queue + maxBurst + 64
	testwait.Eventually(t, "the records the stalled subscriber lost to be counted", func() bool {
		return h.dropped(ReasonSlowQoS0) >= n-maxLag-inFlight
	})
	droppedStalled := int(h.dropped(ReasonSlowQoS0))

	if tc, ok := slow.Conn().(buffered); ok {
		_ = tc.SetReadBuffer(1 << 20) // read the rest quickly
	}
	// A marker appended after the burst arrives once the subscriber has
	// caught up: everything before it was either received or counted.
	h.appendPadded(t, "default", "s/x", 0, n, 1, size)
	last, received := -1, 0
	var got []int // what it received, in order
	for {
		seq := seqOf(t, slow.ReadUntil(packets.Publish).Payload)
		if seq <= last {
			t.Fatalf("record %d after %d: repeated or reordered", seq, last)
		}
		last = seq
		if seq == n {
			break
		}
		got = append(got, seq)
		received++
	}
	dropped := int(h.dropped(ReasonSlowQoS0))
	if received+dropped != n {
		t.Fatalf("received %d + dropped %d = %d, want every one of %d records accounted for", received, dropped, received+dropped, n)
	}
	// The newest records, within maxLag of the end (the marker's append
	// moved the end by one), are never dropped.
	have := map[int]bool{}
	for _, seq := range got {
		have[seq] = true
	}
	for seq := n - maxLag + 1; seq < n; seq++ {
		if !have[seq] {
			t.Fatalf("record %d, within %d of the end %d, was not delivered", seq, maxLag, n)
		}
	}
	t.Logf("%d records: received %d, dropped %d (%d counted while it read nothing)", n, received, dropped, droppedStalled)
	if droppedStalled > dropped {
		t.Fatalf("counted %d while stalled, then %d", droppedStalled, dropped)
	}
}

func TestDelivery_QoS0BurstLargerThanTheQueueLosesNothing(t *testing.T) {
	cfg := testDeliveryConfig()
	cfg.QueueDepth = 8 // far smaller than one read batch
	h := newDeliveryHarness(t, cfg, "default=#")
	c := dialDlvRaw(t, h.addr, "burst0", 4, packets.Properties{})
	c.Subscribe("s/#", 0)

	const n = 3000
	h.appendPadded(t, "default", "s/x", 0, 0, n, 64)
	for want := range n {
		if got := seqOf(t, c.ReadUntil(packets.Publish).Payload); got != want {
			t.Fatalf("got record %d, want %d", got, want)
		}
	}
	if d := h.dropped(ReasonSlowQoS0); d != 0 {
		t.Fatalf("%v QoS 0 records dropped for a subscriber within qos0_max_lag", d)
	}
}

func TestDelivery_WindowBoundsUnackedMessages(t *testing.T) {
	run := func(t *testing.T, version byte, props packets.Properties, cfgWindow, want int) {
		cfg := testDeliveryConfig()
		cfg.SendWindow, cfg.QueueDepth = cfgWindow, 4
		h := newDeliveryHarness(t, cfg, "default=#")
		c := dialDlvRaw(t, h.addr, "noack", version, props)
		c.Subscribe("s/#", 1)
		const n = 40
		h.appendPadded(t, "default", "s/x", 1, 0, n, 16)

		var unacked []packets.Packet
		next := 0
		take := func(k int) {
			for range k {
				pk := c.ReadUntil(packets.Publish)
				if got := seqOf(t, pk.Payload); got != next {
					t.Fatalf("got record %d, want %d", got, next)
				}
				next++
				unacked = append(unacked, pk)
			}
			if next < n {
				// With records left, the sender parks until an ack opens
				// the window; until then it has written all it will.
				testwait.Eventually(t, "the sender to wait for the window", func() bool {
					return parkedIn("(*deliveryClient).waitWindow")
				})
			}
			if extra := pingPublishes(t, c); len(extra) > 0 {
				t.Fatalf("%d unacknowledged, then %d more arrived: window %d not respected", len(unacked), len(extra), want)
			}
		}
		take(want)
		for next < n {
			k := min(3, len(unacked))
			for _, pk := range unacked[:k] {
				c.Puback(pk.PacketID)
			}
			unacked = unacked[k:]
			take(min(k, n-next))
		}
	}
	t.Run("v3 client gets the configured window", func(t *testing.T) {
		run(t, 4, packets.Properties{}, 8, 8)
	})
	t.Run("v5 client gets its smaller Receive Maximum", func(t *testing.T) {
		run(t, 5, packets.Properties{ReceiveMaximum: 3}, 8, 3)
	})
	t.Run("v5 client with a larger Receive Maximum gets the window", func(t *testing.T) {
		run(t, 5, packets.Properties{ReceiveMaximum: 100}, 5, 5)
	})
}

func TestDelivery_LaggingCursorBelowRetentionSkipsAndCounts(t *testing.T) {
	cfg := testDeliveryConfig()
	cfg.QueueDepth, cfg.SendWindow, cfg.ReadBatch = 4, 4, 8
	h := newDeliveryHarness(t, cfg, "default=#")
	c := dialDlvRaw(t, h.addr, "lagger", 4, packets.Properties{})
	c.Subscribe("s/#", 1)
	const n = 200
	h.appendPadded(t, "default", "s/x", 1, 0, n, 16)
	testwait.Eventually(t, "the subscriber to fall back to its own cursor", func() bool { return h.catchups() > 0 })
	h.waitDispatched(t, "default")
	h.log.stream(t, "default").trim(100) // retention removes what the cursor has not read

	var got []int
	for {
		pk := c.ReadUntil(packets.Publish)
		c.Puback(pk.PacketID)
		got = append(got, seqOf(t, pk.Payload))
		if got[len(got)-1] == n-1 {
			break
		}
	}
	skipped := int(h.dropped(ReasonOutOfRetain))
	if skipped == 0 {
		t.Fatal("no record counted as lost to retention")
	}
	if len(got)+skipped != n {
		t.Fatalf("received %d + skipped %d, want %d", len(got), skipped, n)
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatalf("records repeated or reordered: %v", got)
	}
	if got[len(got)-100] != 100 {
		t.Fatalf("after the skip the cursor resumed at %d, want the log start 100", got[len(got)-100])
	}
}

func TestDelivery_SlowSharedGroupLosesNothing(t *testing.T) {
	cfg := testDeliveryConfig()
	cfg.QueueDepth, cfg.SendWindow, cfg.ReadBatch = 4, 4, 16
	h := newDeliveryHarness(t, cfg, "default=#")
	members := []*mqtttest.Raw{
		dialDlvRaw(t, h.addr, "m1", 4, packets.Properties{}),
		dialDlvRaw(t, h.addr, "m2", 4, packets.Properties{}),
	}
	for _, m := range members {
		m.Subscribe("$share/g/s/#", 1)
	}
	const n = 500
	h.appendPadded(t, "default", "s/x", 1, 0, n, 16)
	testwait.Eventually(t, "the group to fall back to its own cursor", func() bool { return h.catchups() > 0 })

	// Each member reads and acknowledges everything it is given.
	seqs := make(chan int, n+10)
	for _, m := range members {
		go func() {
			for {
				pk, err := m.Next()
				if err != nil {
					return // the connection closed at cleanup
				}
				if pk.FixedHeader.Type != packets.Publish || m.Send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID}) != nil {
					continue
				}
				s, _, _ := strings.Cut(string(pk.Payload), " ")
				seq, _ := strconv.Atoi(s)
				seqs <- seq
			}
		}()
	}
	seen := map[int]int{}
	collect := func(want int) {
		t.Helper()
		timeout := time.After(deliveryWait)
		for len(seen) < want {
			select {
			case seq := <-seqs:
				seen[seq]++
				if seen[seq] > 1 {
					t.Fatalf("record %d delivered twice to the group", seq)
				}
			case <-timeout:
				t.Fatalf("group got %d distinct records, want %d", len(seen), want)
			}
		}
	}
	collect(n)
	// Two markers, once the group is back on the shared reader; anything
	// still on its way would arrive before them.
	testwait.Eventually(t, "the group to catch up", func() bool {
		r := h.reader(t, "default")
		r.mu.Lock()
		defer r.mu.Unlock()
		g := r.mu.groups["$share/g/s/#"]
		return g != nil && g.live
	})
	h.appendPadded(t, "default", "s/x", 1, n, 2, 16)
	collect(n + 2)
	for i := range n + 2 {
		if seen[i] != 1 {
			t.Fatalf("record %d delivered %d times", i, seen[i])
		}
	}
}

func TestDelivery_CloseStopsEveryGoroutine(t *testing.T) {
	cfg := testDeliveryConfig()
	cfg.QueueDepth, cfg.SendWindow = 4, 4
	h := newDeliveryHarness(t, cfg, "default=#", "other=o/#")
	// A QoS 0 client that never reads: its sender ends up blocked in a
	// socket write. A QoS 1 client that never acks: its cursor waits.
	stuck := dialDlvRaw(t, h.addr, "stuck", 4, packets.Properties{})
	if tc, ok := stuck.Conn().(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	stuck.Subscribe("s/#", 0)
	noack := dialDlvRaw(t, h.addr, "noack", 4, packets.Properties{})
	noack.Subscribe("s/#", 1)
	p := dialDlvPaho(t, h.addr, "paho")
	p.subscribe(t, "#", 1)
	h.appendPadded(t, "default", "s/x", 1, 0, 5000, 1024)
	testwait.Eventually(t, "a cursor to start", func() bool { return h.catchups() > 0 })

	h.close()
	// Close has waited for every goroutine; some may still be returning
	// from their last frame.
	var left string
	deadline := time.Now().Add(deliveryWait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		left = ""
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "peat/mqtt.(*delivery") {
				left = g
			}
		}
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutine left after Close:\n%s", left)
		}
		runtime.Gosched()
	}
	h.d.Close() // idempotent
}
