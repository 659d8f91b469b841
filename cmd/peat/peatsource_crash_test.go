package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge/sink/sinktest"
)

// TestCrash_PeatSourceMirrorsAcrossKill9 kills a site's `peat serve`
// (kill -9) twice while its peat source replays HQ's stream (another
// `peat serve`) into a mirror stream, and restarts it: the mirror holds
// every HQ record at its HQ offset, none missing, none twice.
func TestCrash_PeatSourceMirrorsAcrossKill9(t *testing.T) {
	const n = 6000
	hq := startPeat(t, filepath.Join(t.TempDir(), "hq"))
	publishOffsets(t, hq.mqttAddr, 0, n) // into an empty stream: payload i at offset i

	dir := t.TempDir()
	config := filepath.Join(dir, "peat.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
streams:
  - {name: default, filters: ["#"]}
  - {name: hq, mirror: true, filters: ["hq/#"]}
sources:
  - name: hq
    backoff: {min: 50ms, max: 200ms}
    peat: {url: "mqtt://%s", client_id: site-a-down, topic: "hq/{topic}", window: 8, upstream_stream: default}
`, hq.mqttAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	p := startPeat(t, data, "--config", config)
	mirrored := func() uint64 {
		for _, s := range p.streams() {
			if s.Name == "hq" {
				return s.CommittedOffset
			}
		}
		return 0
	}
	for round, killAt := range []uint64{n / 4, n / 2} {
		sinktest.WaitFor(t, fmt.Sprintf("%d records mirrored", killAt), 2*time.Minute, func() bool { return mirrored() >= killAt })
		p.kill()
		p = startPeat(t, data, "--config", config)
		got := mirrored()
		t.Logf("round %d: killed, %d mirrored after the restart", round, got)
		if got >= n {
			t.Fatalf("round %d: the replay ended before the kill; slow it down", round)
		}
	}
	sinktest.WaitFor(t, "every record mirrored", 2*time.Minute, func() bool { return mirrored() >= n })

	var mu sync.Mutex
	at := map[uint64]string{}
	total := 0
	cl := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + p.mqttAddr).SetClientID("reader").SetAutoReconnect(false))
	if tok := cl.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer cl.Disconnect(0)
	if tok := cl.Subscribe("$replay/0/+/hq/#", 1, func(_ paho.Client, m paho.Message) {
		// $replay/0/<offset>/hq/sensors/a
		parts := strings.SplitN(m.Topic(), "/", 4)
		off, _ := strconv.ParseUint(parts[2], 10, 64)
		mu.Lock()
		at[off] = string(m.Payload())
		total++
		mu.Unlock()
	}); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sinktest.WaitFor(t, "the mirror replayed", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total >= n
	})
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for off := range uint64(n) {
		if got := at[off]; got != strconv.FormatUint(off, 10) {
			t.Fatalf("mirror offset %d holds %q, want HQ's record %d", off, got, off)
		}
	}
	if total != n {
		t.Errorf("the mirror replayed %d records for HQ's %d", total, n)
	}
}
