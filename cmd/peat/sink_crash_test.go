package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/sinktest"
)

// publishOffsets publishes QoS 1 messages whose payloads are from..to-1 in
// order, from one client, and waits for every PUBACK: into an empty
// stream, each payload is then its record's offset.
func publishOffsets(t *testing.T, addr string, from, to int) {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).
		SetClientID(fmt.Sprintf("pub-%d", from)).SetAutoReconnect(false).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect to %s: %v", addr, tok.Error())
	}
	defer c.Disconnect(0)
	toks := make([]paho.Token, 0, to-from)
	for i := from; i < to; i++ {
		toks = append(toks, c.Publish("sensors/a", 1, false, strconv.Itoa(i)))
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(time.Minute) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", from+i, tok.Error())
		}
	}
}

func (p *peatProc) sinks() []sink.Status {
	p.t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/api/v1/sinks")
	if err != nil {
		p.t.Fatalf("GET /api/v1/sinks: %v", err)
	}
	defer resp.Body.Close()
	var out []sink.Status
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		p.t.Fatalf("decode /api/v1/sinks: %v", err)
	}
	return out
}

// TestCrash_SinkResumesAfterKill9 kills `peat serve` (kill -9) twice while
// its sink drains a backlog to a real mosquitto (behind a proxy that slows
// acknowledgements down), and restarts it: the upstream gets every record,
// first arrivals in order, each repeat a rewind of at most what was sent
// and not committed (sink.MaxResent: the window and a commit batch).
func TestCrash_SinkResumesAfterKill9(t *testing.T) {
	const (
		n      = 3000
		window = 16
	)
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site/#")
	px := sinktest.NewProxy(t, upstream, 20*time.Millisecond)
	px.SetMode(sinktest.ModeDelay)

	dir := t.TempDir()
	config := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
sinks:
  - name: cloud
    mqtt: {url: "mqtt://%s", client_id: site-a, window: %d, topic: "site/{topic}"}
    backoff: {min: 50ms, max: 200ms}
`, px.Addr(), window)), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")

	p := startPeat(t, data, "--config", config)
	publishOffsets(t, p.mqttAddr, 0, n)
	for round, killAt := range []int{n / 3, 2 * n / 3} {
		sinktest.WaitFor(t, fmt.Sprintf("%d records upstream", killAt), 2*time.Minute,
			func() bool { return len(col.Payloads()) >= killAt })
		p.kill()
		got := len(col.Payloads())
		if got >= n {
			t.Fatalf("round %d: the drain ended before the kill; slow it down", round)
		}
		t.Logf("round %d: killed with %d of %d upstream", round, got, n)
		p = startPeat(t, data, "--config", config)
	}
	sinktest.WaitFor(t, "every record upstream", 2*time.Minute, func() bool { return col.HasOffsets(n) })
	sinktest.WaitFor(t, "the sink's position at the end", time.Minute, func() bool {
		st := p.sinks()
		return len(st) == 1 && st[0].Streams[0].CommittedOffset == n
	})
	bound := sink.MaxResent(window)
	dups := sinktest.CheckInOrder(t, col.Payloads(), n, bound)
	t.Logf("%d messages upstream for %d records: %d repeats over 2 kills", len(col.Payloads()), n, dups)
	if dups > 2*bound {
		t.Errorf("%d repeats after 2 kills, want at most %d (the window and a commit batch each)", dups, 2*bound)
	}
}

// TestCrash_KafkaSinkExactlyOnceAcrossKill9 kills `peat serve` (kill -9)
// twice while its exactly_once sink drains to Kafka (franz-go's fake
// cluster, in this test process): by edge offset, the topic holds every
// record once, none twice, none missing.
func TestCrash_KafkaSinkExactlyOnceAcrossKill9(t *testing.T) {
	const n = 6000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "edge.default"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	dir := t.TempDir()
	config := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
sinks:
  - name: lake
    max_rate: 2000
    kafka: {brokers: ["%s"], topic: "edge.{stream}", key: "{topic}", exactly_once: true, site: site-a, window: 64}
    backoff: {min: 50ms, max: 200ms}
`, c.ListenAddrs()[0])), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	p := startPeat(t, data, "--config", config)
	publishOffsets(t, p.mqttAddr, 0, n)
	committed := func() uint64 {
		st := p.sinks()
		if len(st) != 1 || len(st[0].Streams) != 1 {
			return 0
		}
		return st[0].Streams[0].CommittedOffset
	}
	for round, killAt := range []uint64{n / 3, 2 * n / 3} {
		sinktest.WaitFor(t, fmt.Sprintf("position %d", killAt), 2*time.Minute, func() bool { return committed() >= killAt })
		p.kill()
		t.Logf("round %d: killed", round)
		p = startPeat(t, data, "--config", config)
	}
	sinktest.WaitFor(t, "the sink's position at the end", 2*time.Minute, func() bool { return committed() == n })

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("edge.default"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	count := map[uint64]int{}
	total := 0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(count) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "peat-offset" {
					off, _ := strconv.ParseUint(string(h.Value), 10, 64)
					count[off]++
					total++
				}
			}
		})
	}
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	cl.PollFetches(short).EachRecord(func(*kgo.Record) { total++ })
	for off := uint64(0); off < n; off++ {
		if count[off] != 1 {
			t.Errorf("edge offset %d is in Kafka %d times, want once", off, count[off])
		}
	}
	if total != n {
		t.Errorf("%d records in Kafka for %d edge offsets", total, n)
	}
}
