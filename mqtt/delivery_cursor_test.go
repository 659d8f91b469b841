package mqtt

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// A replay whose position falls below the log start while it runs (the
// client reads slowly, retention moves on) skips to the log start, counts
// what it lost as out_of_retention, and goes on in order without repeats.
func TestReplay_FallingBelowLogStartSkipsAndCounts(t *testing.T) {
	l := newMemLog(t, "default=#")
	s := l.stream(t, "default")
	const n, trimAt = 100, 60
	store(t, s, topicsN("t", 0, n), nil)
	b := newTestBroker(t, l, func(c *Config) { c.QueueDepth, c.ReadBatch = 4, 8 })
	conn := rawConnect("slow", 5)
	conn.Properties.ReceiveMaximum = 2
	c := mqtttest.Dial(t, b.Addr().String(), conn)
	c.Subscribe("$replay/earliest/+/t/#", 1)

	offsetOf := func(pk packets.Packet) int {
		t.Helper()
		parts := strings.Split(pk.TopicName, "/")
		off, err := strconv.Atoi(parts[2])
		if err != nil {
			t.Fatalf("delivery topic %q: %v", pk.TopicName, err)
		}
		return off
	}
	var got []int
	held := readPublishes(t, c, 2)
	cl, _ := b.srv.Clients.Get("slow")
	dc := b.deliv.client(cl)
	testwait.Eventually(t, "the sender to wait for the window, the queue full", func() bool {
		return len(dc.queue) == cap(dc.queue) && parkedIn("(*deliveryClient).waitWindow")
	})
	s.trim(trimAt) // retention removes what the tap has not read yet
	for _, pk := range held {
		got = append(got, offsetOf(pk))
		c.Puback(pk.PacketID)
	}
	for got[len(got)-1] != n-1 {
		pk := c.ReadUntil(packets.Publish)
		got = append(got, offsetOf(pk))
		c.Puback(pk.PacketID)
	}

	skipped := int(metricValue(b.deliv.m.Dropped.WithLabelValues(ReasonOutOfRetain)))
	if skipped == 0 {
		t.Fatal("no record counted as lost to retention")
	}
	if len(got)+skipped != n {
		t.Fatalf("received %d + skipped %d, want %d: %v", len(got), skipped, n, got)
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatalf("records repeated or reordered: %v", got)
	}
	if got[len(got)-(n-trimAt)] != trimAt {
		t.Fatalf("after the skip the tap resumed at %d, want the log start %d: %v", got[len(got)-(n-trimAt)], trimAt, got)
	}
}
