package main

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// TestServe_PublishingKeepsAConnectionsStackSmall checks the memory a
// publishing sensor costs: mochi reads each connection on a goroutine of
// its own, and the way a publish takes through mochi to its hooks needs a
// 32 KiB stack, where reading packets needs 16 KiB. Peat takes publishes
// over before that, so a connection's stack does not double once it
// publishes: 1,000 sensors would otherwise hold 16 MB more stack, and the
// garbage collector, which sizes its headroom from the stacks too, about
// as much again.
//
// The broker runs with GOGC=off, so no collection shrinks a stack between
// the two readings of go_memstats_stack_inuse_bytes.
func TestServe_PublishingKeepsAConnectionsStackSmall(t *testing.T) {
	const sensors = 200
	p := startPeatEnv(t, []string{"GOGC=off"}, t.TempDir())
	conns := make([]*mqtttest.Raw, sensors)
	for i := range conns {
		conns[i] = mqtttest.Dial(t, p.mqttAddr, mqtttest.Connect{ClientID: fmt.Sprintf("sensor-%d", i), Version: 4, Clean: true, Keepalive: 60})
	}
	before := p.metric("go_memstats_stack_inuse_bytes")
	for i, c := range conns {
		c.Publish(fmt.Sprintf("sensors/%d/temp", i), 1, 1, "21.5")
		if ack := c.ReadUntil(packets.Puback); ack.PacketID != 1 {
			t.Fatalf("sensor %d: PUBACK for packet id %d, want 1", i, ack.PacketID)
		}
	}
	after := p.metric("go_memstats_stack_inuse_bytes")
	perConn := (after - before) / sensors
	t.Logf("stack in use: %.0f KiB with %d sensors connected, %.0f KiB once each published (%+.1f KiB per sensor)",
		before/1024, sensors, after/1024, perConn/1024)
	if perConn > 8<<10 {
		t.Errorf("publishing once grew the broker's stacks by %.1f KiB per connection; want under 8 KiB "+
			"(a read goroutine that went through mochi's processPublish doubles to 32 KiB)", perConn/1024)
	}
	if got := p.stream("default").NextOffset; got != sensors {
		t.Errorf("default stream next_offset %d, want %d: every publish stored", got, sensors)
	}
}
