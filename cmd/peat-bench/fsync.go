package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// fsyncConfig describes a run of the disk's own durability cost: append a
// small block to a file and fdatasync it, Count times. A durable
// acknowledgement can never be cheaper than one of these, unless many
// acknowledgements share one (group commit).
type fsyncConfig struct {
	Dir   string // a directory on the filesystem to measure
	Count int    // blocks written and synced
	Block int    // bytes per block
}

type fsyncResult struct {
	Elapsed time.Duration
	Sync    *samples // one fdatasync each
}

// runFsync measures fdatasync after each appended block in a temporary
// file under cfg.Dir, which it removes.
func runFsync(cfg fsyncConfig) (*fsyncResult, error) {
	if cfg.Count <= 0 || cfg.Block <= 0 {
		return nil, errors.New("fsync: --count and --block must be positive")
	}
	f, err := os.CreateTemp(cfg.Dir, "peat-bench-fsync-*")
	if err != nil {
		return nil, fmt.Errorf("fsync: create a file in %s: %w", cfg.Dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	block := make([]byte, cfg.Block)
	res := &fsyncResult{Sync: newSamples()}
	start := time.Now()
	for i := range cfg.Count {
		block[0] = byte(i)
		if _, err := f.Write(block); err != nil {
			return nil, fmt.Errorf("fsync: write to %s: %w", f.Name(), err)
		}
		t := time.Now()
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("fsync: fdatasync %s: %w", f.Name(), err)
		}
		res.Sync.add(time.Since(t).Nanoseconds())
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

func fsyncCmd(args []string) error {
	fs := flag.NewFlagSet("fsync", flag.ExitOnError)
	cfg := fsyncConfig{}
	var label string
	fs.StringVar(&cfg.Dir, "dir", os.TempDir(), "directory on the filesystem to measure (the broker's data directory's)")
	fs.IntVar(&cfg.Count, "count", 1000, "blocks appended, each followed by fdatasync")
	fs.IntVar(&cfg.Block, "block", 256, "bytes per block")
	fs.StringVar(&label, "label", "disk", "copied into the output")
	_ = fs.Parse(args)
	res, err := runFsync(cfg)
	if err != nil {
		return err
	}
	dir, _ := filepath.Abs(cfg.Dir)
	p50 := res.Sync.quantile(0.5)
	out := map[string]any{
		"label": label, "workload": "fsync", "dir": dir, "count": cfg.Count, "block": cfg.Block,
		"seconds":      round(res.Elapsed.Seconds()),
		"fsync_per_s":  round(float64(cfg.Count) / res.Elapsed.Seconds()),
		"fsync_p50_ms": round3(p50), "fsync_p99_ms": round3(res.Sync.quantile(0.99)),
		"fsync_p999_ms": round3(res.Sync.quantile(0.999)), "fsync_max_ms": round3(res.Sync.quantile(1)),
	}
	if p50 > 0 {
		out["per_s_at_p50"] = round(1000 / p50) // one durable write at a time, at the median latency
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// round3 keeps three decimals: sub-millisecond latencies need them.
func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }
