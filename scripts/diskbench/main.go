// Command diskbench pushes records through one stream under size retention
// and reports the disk the store takes against max_bytes: scripts/
// bench-disk.sh runs it for each profile and record size.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/peatmq/peat/logstore"
)

var logger *slog.Logger // -v

type result struct {
	Profile      string  `json:"profile"`
	PayloadBytes int     `json:"payload_bytes"`
	MaxBytes     int64   `json:"max_bytes"`
	PushedBytes  int64   `json:"pushed_bytes"` // encoded, as Stream.Bytes counts them
	Records      uint64  `json:"records"`
	PeakDisk     int64   `json:"peak_disk_bytes"`
	FinalDisk    int64   `json:"final_disk_bytes"`
	Bound        int64   `json:"bound_bytes"` // Store.DiskBound
	Refused      int64   `json:"refused_appends"`
	Reclaims     float64 `json:"reclaims"`
	Seconds      float64 `json:"seconds"`
	MBps         float64 `json:"pushed_mb_per_s"`
}

func main() {
	dir := flag.String("dir", "", "parent directory for the store (a fresh subdirectory is used and removed)")
	profile := flag.String("profile", "pi-zero", "storage profile")
	payload := flag.Int("payload", 1024, "payload bytes per record")
	maxBytes := flag.Int64("max-bytes", 16<<20, "the stream's max_bytes")
	times := flag.Float64("times", 4, "push this many times max_bytes")
	writers := flag.Int("writers", 4, "concurrent appenders")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	verbose := flag.Bool("v", false, "log the store's debug lines (reclaims, value-log GC) to stderr")
	flag.Parse()
	if *verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if err := run(*dir, *profile, *payload, *maxBytes, *times, *writers, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "diskbench:", err)
		os.Exit(1)
	}
}

func run(parent, profile string, payload int, maxBytes int64, times float64, writers int, timeout time.Duration) error {
	dir, err := os.MkdirTemp(parent, "diskbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	m := logstore.NewMetrics(nil)
	st, err := logstore.Open(logstore.Config{
		Dir:     dir,
		Profile: logstore.Profile(profile),
		Metrics: m,
		Logger:  logger,
		Streams: []logstore.StreamConfig{{Name: "s", Filters: []string{"#"}, MaxBytes: maxBytes}},
	})
	if err != nil {
		return err
	}
	s := st.Stream("s")
	res := result{Profile: profile, PayloadBytes: payload, MaxBytes: maxBytes, Bound: st.DiskBound()}
	want := int64(times * float64(maxBytes))

	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // samples the disk every 50 ms
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if d := diskBytes(dir); d > peak.Load() {
					peak.Store(d)
				}
			}
		}
	}()

	per := max(1, min(1000, (256<<10)/payload))
	body := make([]byte, payload)
	pushed := func() int64 {
		var d dto.Metric
		_ = m.AppendedBytes.WithLabelValues("s").Write(&d)
		return int64(d.GetCounter().GetValue())
	}
	var refused atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t0 := time.Now()
	var werr error
	var once sync.Once
	var ww sync.WaitGroup
	for range writers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			for ctx.Err() == nil && pushed() < want {
				recs := make([]*logstore.Record, per)
				for i := range recs {
					recs[i] = &logstore.Record{Topic: "sensors/x", Payload: body, QoS: 1}
				}
				if _, err := s.Append(ctx, recs...); err != nil {
					if ctx.Err() != nil {
						return
					}
					refused.Add(1)
					time.Sleep(5 * time.Millisecond)
					once.Do(func() { werr = err })
				}
			}
		}()
	}
	ww.Wait()
	res.Seconds = time.Since(t0).Seconds()
	res.PushedBytes = pushed()
	res.Records = s.NextOffset()
	res.MBps = float64(res.PushedBytes) / res.Seconds / 1e6
	res.FinalDisk = diskBytes(dir)
	close(stop)
	wg.Wait()
	res.PeakDisk = max(peak.Load(), res.FinalDisk)
	res.Refused = refused.Load()
	var d dto.Metric
	_ = m.Reclaims.Write(&d)
	res.Reclaims = d.GetCounter().GetValue()
	if err := st.Close(); err != nil {
		return err
	}
	if res.PushedBytes < want {
		return fmt.Errorf("pushed %d of %d bytes in %v (first error: %v)", res.PushedBytes, want, timeout, werr)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// diskBytes is the space the files under dir take (allocated blocks:
// Badger's files are sparse).
func diskBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
