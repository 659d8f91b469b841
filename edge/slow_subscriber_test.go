package edge

import (
	"bytes"
	"encoding/binary"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// brokerHeap estimates the live heap bytes allocated by Peat's and mochi's
// code (not Badger's, whose table builders come and go with compactions),
// from the runtime's sampled heap profile, scaled as pprof scales it.
func brokerHeap() int64 {
	runtime.GC()
	runtime.GC() // the profile is as of the last completed cycle
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
	rate := float64(runtime.MemProfileRate)
	var total float64
	for _, r := range recs {
		if r.InUseObjects() == 0 || !allocatedByBroker(r.Stack()) {
			continue
		}
		avg := float64(r.InUseBytes()) / float64(r.InUseObjects())
		total += float64(r.InUseBytes()) / (1 - math.Exp(-avg/rate))
	}
	return int64(total)
}

func allocatedByBroker(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/peatmq/peat/") || strings.HasPrefix(f.Function, "github.com/mochi-mqtt/") {
			return !strings.Contains(f.Function, "_test") && !strings.Contains(f.Function, ".Test") &&
				!strings.Contains(f.Function, "/mqtttest.")
		}
		if !more {
			return false
		}
	}
}

// publishNumbered publishes count QoS 1 payloads of size bytes, payload i
// starting with i (big-endian uint64), on topic(i), 256 in flight, and waits
// for every PUBACK.
func publishNumbered(tb testing.TB, n *Node, count, size int, topic func(i int) string) {
	tb.Helper()
	pub := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID("pub").SetAutoReconnect(false).SetMaxResumePubInFlight(64))
	if tok := pub.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("connect: %v", tok.Error())
	}
	defer pub.Disconnect(0)
	payload := make([]byte, size)
	toks := make([]paho.Token, 0, 256)
	for i := range count {
		binary.BigEndian.PutUint64(payload, uint64(i))
		toks = append(toks, pub.Publish(topic(i), 1, false, bytes.Clone(payload)))
		if len(toks) == cap(toks) || i == count-1 {
			for _, tok := range toks {
				if !tok.WaitTimeout(60*time.Second) || tok.Error() != nil {
					tb.Fatalf("publish: %v", tok.Error())
				}
			}
			toks = toks[:0]
		}
	}
}

// readNumbered reads count QoS 1 PUBLISHes from c, acknowledging each, and
// fails unless payload i starts with i: nothing lost, repeated or reordered.
func readNumbered(tb testing.TB, c *mqtttest.Raw, count int) {
	tb.Helper()
	for want := range uint64(count) {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			tb.Fatalf("got packet type %d, want PUBLISH", pk.FixedHeader.Type)
		}
		if got := binary.BigEndian.Uint64(pk.Payload); got != want {
			tb.Fatalf("got message %d, want %d: lost, repeated or reordered", got, want)
		}
		c.Puback(pk.PacketID)
	}
}

// A QoS 1 subscriber that stops reading while far more is published than
// fits in memory loses nothing, and the broker's heap does not grow with
// what it has not yet read: the subscriber's place is an offset in the log.
func TestNode_SlowQoS1SubscriberLosesNothingInBoundedMemory(t *testing.T) {
	cfg := testConfig(t)
	cfg.Storage.Profile = string(logstore.ProfilePiZero) // small Badger memtables
	cfg.Streams[0].Durability = string(logstore.DurabilityInterval)
	n := startNode(t, cfg)
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 64 << 10

	// An MQTT 3.1.1 client that reads only when told to, with the default
	// socket buffers: a backlog of 80 MB does not fit in them.
	slow := mqtttest.Dial(t, n.MQTTAddr().String(), mqtttest.Connect{ClientID: "slow", Version: 4, Clean: true, Keepalive: 600})
	if pk := slow.Subscribe("sensors/#", 1); pk.ReasonCodes[0] != 1 {
		t.Fatalf("subscribe: %+v", pk)
	}

	const count, size = 20000, 4096 // 80 MB the subscriber does not read
	before := brokerHeap()
	publishNumbered(t, n, count, size, func(int) string { return "sensors/a" })
	grown := brokerHeap() - before
	t.Logf("the broker's heap grew %d KiB while %d MiB waited for the subscriber", grown>>10, count*size>>20)
	if limit := int64(16 << 20); grown > limit {
		t.Errorf("the broker's heap grew %d MiB with a subscriber %d MiB behind; want under %d MiB (memory must not follow the backlog)",
			grown>>20, count*size>>20, limit>>20)
	}

	readNumbered(t, slow, count)
}
