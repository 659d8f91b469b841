package edge

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// A replay of a history far larger than memory costs the broker a bounded
// amount of heap: the reader's batch, the client's queue and window, not the
// history. The replaying client here reads nothing until the heap is
// measured, then reads everything, checking each offset once, in order.
func TestNode_ReplayOfALargeHistoryInBoundedMemory(t *testing.T) {
	cfg := testConfig(t)
	cfg.Storage.Profile = string(logstore.ProfilePiZero)
	cfg.Streams[0].Durability = string(logstore.DurabilityInterval)
	n := startNode(t, cfg)
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 64 << 10

	const count, size = 10000, 4096 // 40 MB of history
	publishNumbered(t, n, count, size, func(i int) string { return fmt.Sprintf("sensors/%d", i%8) })

	before := brokerHeap()
	c := mqtttest.Dial(t, n.MQTTAddr().String(), mqtttest.Connect{ClientID: "replay", Version: 4, Clean: true, Keepalive: 600})
	c.Subscribe("$replay/earliest/+/sensors/#", 1)
	// Let the tap fill what it may (queue, window, socket buffers) while
	// the client reads nothing.
	time.Sleep(500 * time.Millisecond)
	grown := brokerHeap() - before
	t.Logf("the broker's heap grew %d KiB replaying %d MiB to a client that reads nothing yet", grown>>10, count*size>>20)
	if limit := int64(16 << 20); grown > limit {
		t.Errorf("heap grew %d MiB for a %d MiB replay; want under %d MiB (memory must not follow the history)",
			grown>>20, count*size>>20, limit>>20)
	}
	readNumbered(t, c, count)
}
