package mqtt

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/mqtt/mqtttest"
)

// A publishing client's read goroutine keeps the 16 KiB stack reading
// packets needs: ingest takes the publish in OnPacketRead, before mochi's
// processPublish, whose frames would double it to 32 KiB (doc.go, "Memory
// per connection"). Checked in process so that it also runs on arm64 under
// qemu (scripts/test-arm.sh); cmd/peat checks a real peat serve.
func TestIngest_PublishingKeepsTheReadStack(t *testing.T) {
	if raceEnabled {
		// Its instrumentation takes mochi's read path past 16 KiB before
		// any hook runs. TestServe_PublishingKeepsAConnectionsStackSmall
		// (cmd/peat) checks a peat binary built without it in make test.
		t.Skip("the race detector enlarges stack frames")
	}
	const clients = 100
	l := newMemLog(t, "default=#")
	st := l.stream(t, "default")
	b := newTestBroker(t, l)
	// No collection may shrink a stack between the two readings.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	conns := make([]*mqtttest.Raw, clients)
	for i := range conns {
		conns[i] = dialRaw(t, b, fmt.Sprintf("sensor-%d", i), 4)
	}
	before := stackInUse()
	for i, c := range conns {
		c.Publish(fmt.Sprintf("sensors/%d", i), 1, 1, "21.5")
		if ack := c.ReadUntil(packets.Puback); ack.PacketID != 1 {
			t.Fatalf("client %d: PUBACK for %d, want 1", i, ack.PacketID)
		}
	}
	after := stackInUse()
	perClient := (float64(after) - float64(before)) / clients
	t.Logf("stack in use %d KiB -> %d KiB (%+.1f KiB per client)", before>>10, after>>10, perClient/1024)
	if perClient > 8<<10 {
		t.Errorf("one publish grew the stacks by %.1f KiB per client; want under 8 KiB", perClient/1024)
	}
	st.waitRecords(t, clients)
}

func stackInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.StackInuse
}
