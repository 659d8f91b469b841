package mqtt

import (
	"bufio"
	"fmt"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// BenchmarkDeliverFanout measures live delivery through the shared reader
// (and, for a subscriber whose queue fills, its catch-up cursor): b.N
// records of 128 bytes appended to a Badger log in batches of 1,000, each
// delivered to every one of subs MQTT 5 subscribers of bench/# in the same
// process. The appends are timed too; msg/s counts deliveries. QoS0MaxLag
// is raised so that no QoS 0 delivery is dropped.
func BenchmarkDeliverFanout(b *testing.B) {
	for _, bc := range []struct {
		subs int
		qos  byte
	}{
		{1, 0}, {10, 0}, {10, 1},
	} {
		b.Run(fmt.Sprintf("QoS%d-v5-subs%d", bc.qos, bc.subs), func(b *testing.B) { benchFanout(b, bc.subs, bc.qos) })
	}
}

func benchFanout(b *testing.B, subs int, qos byte) {
	st, err := logstore.Open(logstore.Config{
		Dir:          b.TempDir(),
		Profile:      logstore.Profile(*replayBenchProfile),
		Streams:      []logstore.StreamConfig{{Name: "default", Filters: []string{"#"}, Durability: logstore.DurabilityInterval}},
		MinFreeBytes: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	br := newTestBroker(b, storeLog{st}, func(c *Config) { c.SendWindow, c.QoS0MaxLag = 100, 1<<30 })

	done := make(chan error, subs)
	for i := range subs {
		raw := mqtttest.Dial(b, br.Addr().String(), mqtttest.Connect{ClientID: fmt.Sprintf("fanout-%d", i), Version: 5,
			Clean: true, Properties: packets.Properties{ReceiveMaximum: 100}})
		raw.Subscribe("bench/#", qos)
		conn := raw.Conn()
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Minute)) // a hang fails, late
		go func() {
			_, err := readReplay(bufio.NewReaderSize(conn, 256<<10), bufio.NewWriterSize(conn, 4<<10), b.N)
			done <- err
		}()
	}
	b.SetBytes(128)
	b.ResetTimer()
	fillBenchLog(b, st.Stream("default"), b.N)
	for range subs {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*subs)/b.Elapsed().Seconds(), "msg/s")
}
