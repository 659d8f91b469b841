package logstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestStore_DiskFullRefusesAppendsLogsOnceAndRecovers(t *testing.T) {
	logs := &logCapture{}
	cfg := testConfig(t)
	cfg.Logger = slog.New(logs)
	cfg.MinFreeBytes = 1 << 20
	st := openStore(t, cfg)
	var free atomic.Uint64
	free.Store(1 << 40)
	st.space.every = 0 // look at the (fake) filesystem on every batch
	st.space.free = func(string) (uint64, uint64, error) { return free.Load(), 1 << 41, nil }
	s := st.Stream("default")
	appendN(t, s, 5, 5)

	free.Store(1000) // the disk fills up
	for i := range 10 {
		_, err := s.Append(context.Background(), rec("a", fmt.Sprint(i)))
		if !errors.Is(err, ErrNoSpace) {
			t.Fatalf("Append on a full disk = %v, want ErrNoSpace", err)
		}
	}
	if n := logs.count(slog.LevelError, "disk full"); n != 1 {
		t.Fatalf("disk full logged %d times for 10 refused appends, want once", n)
	}
	if s.NextOffset() != 5 {
		t.Fatalf("NextOffset = %d after refused appends, want 5", s.NextOffset())
	}
	if got := counterValue(t, st.metrics.AppendErrors.WithLabelValues("default", reasonNoSpace)); got != 10 {
		t.Fatalf("no_space append errors = %v, want 10", got)
	}

	free.Store(1 << 40) // space returns
	first, err := s.Append(context.Background(), rec("a", "back"))
	if err != nil || first != 5 {
		t.Fatalf("Append after space returned = %d, %v; want 5", first, err)
	}
	if n := logs.count(slog.LevelInfo, "space available again"); n != 1 {
		t.Fatalf("recovery logged %d times, want once", n)
	}
	recs := readAll(t, s, 0)
	if len(recs) != 6 || string(recs[4].Payload) != "p4" || string(recs[5].Payload) != "back" {
		t.Fatalf("log after the episode: %d records", len(recs))
	}
}

func TestIsNoSpace(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{syscall.ENOSPC, true},
		{fmt.Errorf("write vlog: %w", syscall.ENOSPC), true},
		{errors.New("writeRequests err: sync /x/000001.vlog: no space left on device"), true}, // badger's %+v flattening
		{errors.New("permission denied"), false},
		{nil, false},
	} {
		if got := isNoSpace(tc.err); got != tc.want {
			t.Errorf("isNoSpace(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestStore_IntervalDurability(t *testing.T) {
	cfg := testConfig(t, StreamConfig{Name: "fast", Filters: []string{"#"}, Durability: DurabilityInterval, SyncInterval: 5e6})
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.syncWrites {
		t.Fatal("SyncWrites on although every stream is interval")
	}
	appendN(t, st.Stream("fast"), 300, 7)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, cfg).Stream("fast")
	if s.NextOffset() != 300 || len(readAll(t, s, 0)) != 300 {
		t.Fatalf("after reopen NextOffset %d", s.NextOffset())
	}
	mixed := testConfig(t, StreamConfig{Name: "a", Filters: []string{"a"}, Durability: DurabilityInterval},
		StreamConfig{Name: "b", Filters: []string{"b"}})
	if st := openStore(t, mixed); !st.syncWrites {
		t.Fatal("SyncWrites off although a stream asks for fsync")
	}
}

func TestMetrics_CountAppends(t *testing.T) {
	cfg := testConfig(t)
	cfg.Metrics = NewMetrics(nil)
	st := openStore(t, cfg)
	appendN(t, st.Stream("default"), 30, 10)
	if got := counterValue(t, cfg.Metrics.AppendedRecords.WithLabelValues("default")); got != 30 {
		t.Fatalf("appended records = %v, want 30", got)
	}
	if got := counterValue(t, cfg.Metrics.AppendedBytes.WithLabelValues("default")); got != float64(st.Stream("default").Bytes()) {
		t.Fatalf("appended bytes = %v, want Bytes() %d", got, st.Stream("default").Bytes())
	}
}

func TestMetrics_RegisteredWithGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := testConfig(t)
	cfg.Metrics = NewMetrics(reg)
	st := openStore(t, cfg)
	appendN(t, st.Stream("default"), 3, 3)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetGauge() != nil {
				got[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	if got["peat_log_next_offset"] != 3 || got["peat_log_committed_offset"] != 3 || got["peat_log_first_offset"] != 0 || got["peat_log_retained_bytes"] == 0 {
		t.Fatalf("gauges = %v", got)
	}
}

func TestMetrics_DiskGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := testConfig(t)
	cfg.Metrics = NewMetrics(reg)
	cfg.MinFreeBytes = 1 << 20
	var free atomic.Uint64
	free.Store(10 << 20)
	cfg.FreeSpace = func(string) (uint64, uint64, error) { return free.Load(), 1 << 30, nil }
	st := openStore(t, cfg)
	st.space.every = 0
	gauges := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if m.GetGauge() != nil && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetName() == "dir" {
					if m.GetLabel()[0].GetValue() != cfg.Dir {
						t.Fatalf("%s{dir=%q}, want dir %q", mf.GetName(), m.GetLabel()[0].GetValue(), cfg.Dir)
					}
					got[mf.GetName()] = m.GetGauge().GetValue()
				}
			}
		}
		return got
	}
	want := map[string]float64{"peat_disk_free_bytes": 10 << 20, "peat_disk_size_bytes": 1 << 30, "peat_disk_reserve_bytes": 1 << 20, "peat_disk_refusing": 0}
	if got := gauges(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("disk gauges = %v, want %v", got, want)
	}
	free.Store(1000)
	if _, err := st.Stream("default").Append(context.Background(), rec("a", "b")); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Append = %v, want ErrNoSpace", err)
	}
	want["peat_disk_free_bytes"], want["peat_disk_refusing"] = 1000, 1
	if got := gauges(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("disk gauges while refusing = %v, want %v", got, want)
	}
}

// A removed stream leaves no series behind in /metrics.
func TestMetrics_RemovedStreamForgotten(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := testConfig(t)
	cfg.Metrics = NewMetrics(reg)
	st := openStore(t, cfg)
	s, err := st.AddStream(StreamConfig{Name: "sensors", Filters: []string{"sensors/#"}})
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 3, 3)
	cfg.Metrics.AppendErrors.WithLabelValues("sensors", reasonIO).Inc()
	series := func() (n int) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "stream" && lp.GetValue() == "sensors" {
						n++
					}
				}
			}
		}
		return n
	}
	if series() == 0 {
		t.Fatal("no series for the stream before removal")
	}
	if err := st.RemoveStream("sensors"); err != nil {
		t.Fatal(err)
	}
	if n := series(); n != 0 {
		t.Fatalf("%d series still name the removed stream", n)
	}
}
