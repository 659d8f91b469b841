package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/peatmq/peat/edge/sink/sinktest"
)

// TestCrash_PeatSinkMirrorAcrossKill9 mirrors a site's stream into a
// second `peat serve` (hq) through a Peat sink, kills the site (kill -9)
// mid-drain and restarts it, then kills hq mid-drain and restarts it on
// the same port: at the end, $replay on hq gives the site's records at
// the site's offsets, with their payloads and timestamps and their topics
// under site-a/, each once (hq has a stream of its own beside the mirror).
func TestCrash_PeatSinkMirrorAcrossKill9(t *testing.T) {
	const n = 3000
	dir := t.TempDir()
	hqConfig := filepath.Join(dir, "hq.yaml")
	if err := os.WriteFile(hqConfig, []byte(`
streams:
  - name: default
    filters: ["#"]
  - name: site-a.default
    mirror: true
    filters: ["site-a/#"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	hqData := filepath.Join(dir, "hq")
	hq := startPeat(t, hqData, "--config", hqConfig)
	hqAddr := hq.mqttAddr

	siteConfig := filepath.Join(dir, "site.yaml")
	if err := os.WriteFile(siteConfig, []byte(fmt.Sprintf(`
sinks:
  - name: hq
    max_rate: 1000
    peat: {url: "mqtt://%s", client_id: site-a, mirror_as: "site-a.{stream}", topic: "site-a/{topic}", window: 16}
    backoff: {min: 50ms, max: 200ms}
`, hqAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	siteData := filepath.Join(dir, "site")
	site := startPeat(t, siteData, "--config", siteConfig)
	publishOffsets(t, site.mqttAddr, 0, n)

	mirrored := func() uint64 {
		select {
		case <-hq.exited:
			t.Fatalf("hq exited: %v\n%s", hq.exitErr, hq.log())
		default:
		}
		for _, s := range hq.streams() {
			if s.Name == "site-a.default" {
				return s.NextOffset
			}
		}
		t.Fatalf("hq has no stream site-a.default: %+v", hq.streams())
		return 0
	}
	sinktest.WaitFor(t, "a third mirrored", 2*time.Minute, func() bool { return mirrored() >= n/3 })
	site.kill()
	t.Logf("site killed with %d of %d mirrored", mirrored(), n)
	site = startPeat(t, siteData, "--config", siteConfig)

	sinktest.WaitFor(t, "two thirds mirrored", 2*time.Minute, func() bool { return mirrored() >= 2*n/3 })
	hq.kill()
	hq = startPeat(t, hqData, "--config", hqConfig, "--mqtt", hqAddr)
	if m := mirrored(); m >= n {
		t.Fatalf("the drain ended before hq was killed (%d mirrored); slow it down", m)
	} else {
		t.Logf("hq restarted with %d of %d mirrored", m, n)
	}

	sinktest.WaitFor(t, "the sink's position at the end", 2*time.Minute, func() bool {
		st := site.sinks()
		return len(st) == 1 && len(st[0].Streams) == 1 && st[0].Streams[0].CommittedOffset == n
	})
	code, src, stderr := runReplayCmd(t, site.mqttAddr, "sensors/#")
	if code != exitOK || len(src) != n {
		t.Fatalf("peat replay on the site: exit %d, %d lines, want %d; stderr:\n%s", code, len(src), n, stderr)
	}
	code, dst, stderr := runReplayCmd(t, hqAddr, "site-a/sensors/#")
	if code != exitOK {
		t.Fatalf("peat replay on hq: exit %d; stderr:\n%s", code, stderr)
	}
	if len(dst) != len(src) {
		t.Fatalf("hq's mirror has %d records, the site %d", len(dst), len(src))
	}
	for i := range src {
		src[i].topic = "site-a/" + src[i].topic
		if src[i] != dst[i] {
			t.Fatalf("record %d: site %+v, hq %+v", i, src[i], dst[i])
		}
	}
	if m := mirrored(); m != n {
		t.Fatalf("hq's mirror ends at %d, the site's stream at %d", m, n)
	}
}
