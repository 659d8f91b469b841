package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/edge/sink/sinktest"
)

// TestCrash_KafkaSourceExactlyOnceAcrossKill9 kills `peat serve` (kill -9)
// twice while its kafka source drains a topic (franz-go's fake cluster,
// in this test process) into the local stream, small batches at a time,
// and restarts it: the stream holds every Kafka record once, none twice,
// none missing, as a $replay of it shows.
func TestCrash_KafkaSourceExactlyOnceAcrossKill9(t *testing.T) {
	const n = 20000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "commands"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("commands"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Key: []byte("dev" + strconv.Itoa(i%5)), Value: []byte(strconv.Itoa(i))})
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	config := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
streams:
  - {name: default, filters: ["#"]}
  - {name: cmds, filters: ["cmd/#"]}
sources:
  - name: lake
    backoff: {min: 50ms, max: 200ms}
    kafka: {brokers: ["%s"], topics: [commands], topic: "cmd/{key}", max_batch: 10}
`, c.ListenAddrs()[0])), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	p := startPeat(t, data, "--config", config)
	stored := func() uint64 {
		for _, s := range p.streams() {
			if s.Name == "cmds" {
				return s.CommittedOffset
			}
		}
		return 0
	}
	for round, killAt := range []uint64{n / 4, n / 2} {
		sinktest.WaitFor(t, fmt.Sprintf("%d records stored", killAt), 2*time.Minute, func() bool { return stored() >= killAt })
		p.kill()
		t.Logf("round %d: killed", round)
		p = startPeat(t, data, "--config", config)
		if got := stored(); got >= n {
			t.Fatalf("round %d: the drain ended before the kill (%d stored); slow it down", round, got)
		}
	}
	sinktest.WaitFor(t, "every record stored", 2*time.Minute, func() bool { return stored() >= n })
	time.Sleep(500 * time.Millisecond) // a duplicate would land meanwhile
	if got := stored(); got != n {
		t.Errorf("%d records stored for %d in Kafka", got, n)
	}

	// Read the stream back as a consumer would.
	var mu sync.Mutex
	count := map[string]int{}
	total := 0
	cl := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + p.mqttAddr).SetClientID("reader").SetAutoReconnect(false))
	if tok := cl.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer cl.Disconnect(0)
	if tok := cl.Subscribe("$replay/0/+/cmd/#", 1, func(_ paho.Client, m paho.Message) {
		mu.Lock()
		count[string(m.Payload())]++
		total++
		mu.Unlock()
	}); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sinktest.WaitFor(t, "the replay", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total >= n
	})
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if c := count[strconv.Itoa(i)]; c != 1 {
			t.Errorf("Kafka value %d stored %d times, want once", i, c)
		}
	}
	if total != n {
		t.Errorf("replay delivered %d records for %d in Kafka", total, n)
	}
}
