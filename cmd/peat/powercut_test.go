//go:build linux && (amd64 || arm64)

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/cmd/peat/internal/cutfs"
)

// Power-cut test shape: rounds of a cut under QoS 1 load, on one disk.
const (
	powerCutRounds    = 5
	powerCutMaxKillAt = 3000 // the cut comes after a random number of acks below this
)

// TestPowerCut_FsyncDurabilityKeepsEveryAcknowledgedMessage is the crash
// test with a power cut instead of kill -9: peat serve runs on a cutfs
// mount (internal/cutfs), which, when it is taken down, loses everything
// written since each file's last fsync, as a power cut would. kill -9
// keeps the page cache, so the crash test cannot tell fsync durability
// from interval; this one can. Every acknowledged message must be in the
// log exactly once, with contiguous offsets, after each of several cuts
// on the same data.
func TestPowerCut_FsyncDurabilityKeepsEveryAcknowledgedMessage(t *testing.T) {
	disk, rng := powerCutSetup(t)
	acked := make(map[string]bool)
	for round := range powerCutRounds {
		killAt := rng.IntN(powerCutMaxKillAt)
		n, files := powerCutRound(t, disk, round, killAt, acked)
		t.Logf("round %d: cut after %d acks: %d acknowledged, %d files lost unsynced writes", round, killAt, n, files)
		checkCrashLog(t, filepath.Join(disk, "data"), acked)
		if t.Failed() {
			return
		}
	}
}

// TestPowerCut_IntervalDurabilityLosesWhatItDidNotSync is the control: with
// durability interval and a sync interval longer than the run, the same cut
// loses acknowledged messages, as the README says it may. If it lost none,
// the cut would not be cutting, and the fsync test above would prove
// nothing.
func TestPowerCut_IntervalDurabilityLosesWhatItDidNotSync(t *testing.T) {
	disk, _ := powerCutSetup(t)
	config := intervalConfig(t, "1h")
	acked := make(map[string]bool)
	n, files := powerCutRound(t, disk, 0, 1000, acked, "--config", config)
	if n == 0 || files == 0 {
		t.Fatalf("%d acknowledged, %d files with unsynced writes: the run wrote nothing to lose", n, files)
	}
	recs := readLog(t, filepath.Join(disk, "data"), "default")
	kept := 0
	for _, r := range recs {
		if acked[string(r.Payload)] {
			kept++
		}
	}
	t.Logf("interval durability: %d of %d acknowledged messages survived the cut", kept, n)
	if kept >= n {
		t.Fatalf("all %d acknowledged messages survived a cut an hour before the next sync: the cut lost nothing", n)
	}
}

// TestPowerCut_IntervalDurabilityKeepsWhatItSynced: with durability
// interval a power cut may lose what was written in the last sync_interval,
// and nothing older. Every message is acknowledged, a few intervals pass,
// then the power goes: every one must be there. The messages fill more
// than one 32 MiB value-log file (the tests run the pi-zero profile), so
// the log spans a file Badger has moved past. The control above shows the
// same cut losing everything when nothing syncs.
func TestPowerCut_IntervalDurabilityKeepsWhatItSynced(t *testing.T) {
	disk, _ := powerCutSetup(t)
	config := intervalConfig(t, "50ms")
	const perPublisher = 1100 // 4 x 1100 x 8 KiB: 34 MiB of payloads
	pad := strings.Repeat("x", 8<<10)
	acked := make(map[string]bool)
	files := powerCut(t, disk, func(data string) {
		publishThenWait(t, data, config, perPublisher, pad, acked)
	})
	data := filepath.Join(disk, "data")
	vlogs, _ := filepath.Glob(filepath.Join(data, "*.vlog"))
	t.Logf("%d acknowledged, %d value-log files, %d files lost unsynced writes", len(acked), len(vlogs), files)
	if len(vlogs) < 2 {
		t.Fatalf("%d value-log files: Badger never moved to a new one, the test cannot tell", len(vlogs))
	}
	checkCrashLog(t, data, acked)
}

// publishThenWait runs peat serve on data with config, publishes
// perPublisher padded QoS 1 messages from each of crashPublishers clients,
// adds every acknowledged one to acked (all must be), lets six 50 ms sync
// intervals pass, and kills peat.
func publishThenWait(t *testing.T, data, config string, perPublisher int, pad string, acked map[string]bool) {
	t.Helper()
	p := startPeat(t, data, "--config", config)
	var wg sync.WaitGroup
	pubs := make([]*publisher, crashPublishers)
	for i := range pubs {
		id := fmt.Sprintf("i%d", i)
		pubs[i] = newPublisher(t, p.mqttAddr, id, "crash/"+id, crashWindow)
		pubs[i].pad = pad
		wg.Go(func() { pubs[i].publish(perPublisher) })
	}
	wg.Wait()
	for _, pub := range pubs {
		seqs := pub.wait()
		if len(seqs) != perPublisher {
			t.Fatalf("%s: %d of %d publishes acknowledged\n%s", pub.id, len(seqs), perPublisher, p.log())
		}
		for _, seq := range seqs {
			acked[payloadOf(pub.id, seq)+pad] = true
		}
	}
	time.Sleep(300 * time.Millisecond) // six sync intervals
	p.kill()
}

// intervalConfig writes a config whose one stream, default, has durability
// interval with syncInterval, and returns its path.
func intervalConfig(t *testing.T, syncInterval string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "peat.yaml")
	yaml := "streams:\n  - name: default\n    filters: [\"#\"]\n    durability: interval\n    sync_interval: " + syncInterval + "\n"
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

func powerCutSetup(t *testing.T) (disk string, rng *rand.Rand) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the power-cut test mounts a FUSE file system with mount(2): needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("the power-cut test needs FUSE: %v", err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return t.TempDir(), rand.New(rand.NewPCG(seed, 0xc07))
}

// powerCutRound mounts disk, runs a crash round on the mount (peat serve,
// QoS 1 load, kill -9 once killAt acks have come), takes the mount down
// and cuts. It returns how many messages were acknowledged and how many
// files the cut changed.
func powerCutRound(t *testing.T, disk string, round, killAt int, acked map[string]bool, args ...string) (int, int) {
	t.Helper()
	var n int
	files := powerCut(t, disk, func(data string) {
		n = crashRound(t, data, round, killAt, 0, acked, args...)
	})
	return n, files
}

// powerCut mounts disk, calls run with the data directory on the mount
// (run must leave no process using it), takes the mount down and cuts. It
// returns how many files the cut changed.
func powerCut(t *testing.T, disk string, run func(data string)) int {
	t.Helper()
	mnt := t.TempDir()
	fs, err := cutfs.Mount(disk, mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Unmount() // when run fails; a second Unmount does nothing
	run(filepath.Join(mnt, "data"))
	if err := fs.Unmount(); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	files, err := fs.Cut()
	if err != nil {
		t.Fatalf("cut: %v", err)
	}
	return files
}
