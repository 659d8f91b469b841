//go:build linux

package mqttsink_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/mqttsink"
	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// statePositions keeps positions in the stream's state, as the broker's
// consumer groups do (mqtt.GroupStateKey), and closes done once the
// position reaches end.
type statePositions struct {
	st   *logstore.Stream
	end  uint64
	once sync.Once
	done chan struct{}
}

func (p *statePositions) Load(string, string) (uint64, bool, error) { return 0, false, nil }

func (p *statePositions) Commit(group, _ string, off uint64) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], off)
	if err := p.st.WriteState(map[string][]byte{mqtt.GroupStateKey(group): v[:]}, nil); err != nil {
		return err
	}
	if off >= p.end {
		p.once.Do(func() { close(p.done) })
	}
	return nil
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backlog is a log shared by the runs of BenchmarkDrain in one process:
// filling it costs more than draining it, so each run drains the first
// b.N records of it under a new sink name, and it grows when a run needs
// more.
var backlog struct {
	sync.Mutex
	store *logstore.Store
	n     int
}

// The backlog's shape, from the environment: DRAIN_BATCH records per
// append (default 100, a group commit of ten publishers with a window of
// ten each; 1 is one publisher waiting for each PUBACK) and
// DRAIN_DURABILITY of the stream (default interval, as
// scripts/bench-sink.sh runs Peat; "fsync" is Peat's default, under
// which every Badger write, position commits too, is fsynced).
func drainShape(b *testing.B) (batch int, durability logstore.Durability) {
	batch, durability = 100, logstore.DurabilityInterval
	if v := os.Getenv("DRAIN_BATCH"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("DRAIN_BATCH=%q: want a positive number", v)
		}
		batch = n
	}
	if v := os.Getenv("DRAIN_DURABILITY"); v != "" {
		durability = logstore.Durability(v)
	}
	return batch, durability
}

// backlogOf returns the shared log, holding at least n records.
func backlogOf(b *testing.B, n int) *logstore.Stream {
	backlog.Lock()
	defer backlog.Unlock()
	if backlog.store == nil {
		dir, err := os.MkdirTemp("", "peat-drain-bench-")
		if err != nil {
			b.Fatal(err)
		}
		_, durability := drainShape(b)
		store, err := logstore.Open(logstore.Config{Dir: dir,
			Streams: []logstore.StreamConfig{{Name: "default", Filters: []string{"#"}, Durability: durability}}})
		if err != nil {
			b.Fatal(err)
		}
		backlog.store = store
		drainDir = dir
	}
	st := backlog.store.Stream("default")
	payload := make([]byte, 64)
	now := time.Now().UnixMilli()
	batch, _ := drainShape(b)
	for backlog.n < n {
		recs := make([]*logstore.Record, min(batch, n-backlog.n))
		for j := range recs {
			recs[j] = &logstore.Record{Topic: fmt.Sprintf("sensors/%d", (backlog.n+j)%10), QoS: 1, Payload: payload, Timestamp: now}
		}
		if _, err := st.Append(context.Background(), recs...); err != nil {
			b.Fatal(err)
		}
		backlog.n += len(recs)
	}
	return st
}

// drainDir is the shared log's directory, removed by TestMain.
var drainDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if backlog.store != nil {
		_ = backlog.store.Close()
		_ = os.RemoveAll(drainDir)
	}
	os.Exit(code)
}

var drainRun atomic.Int64

// BenchmarkDrain drains a backlog of b.N records (64-byte payloads, ten
// topics) from a real log to a real Mosquitto on loopback, as the sink
// does after an outage: MQTT 5, QoS 1, the default window (Mosquitto's
// Receive Maximum, 20, lowers it), positions written to the stream's
// state as the broker's groups are. It reports
// records/s and this process's CPU per record (the sink, the log read
// and the position writes; Mosquitto runs in its own process).
//
//	go test -run '^$' -bench BenchmarkDrain -benchtime 200000x -count 5 ./edge/sink/mqttsink/
//	DRAIN_MOSQUITTO="max_inflight_messages 0" go test -run '^$' -bench BenchmarkDrain ...
//	DRAIN_BATCH=1 DRAIN_DURABILITY=fsync go test -run '^$' -bench BenchmarkDrain ...
func BenchmarkDrain(b *testing.B) {
	// Mosquitto as installed (Nagle on, Receive Maximum 20), unless
	// DRAIN_MOSQUITTO adds option lines ("max_inflight_messages 0": no
	// Receive Maximum, the sink's window of 64; "set_tcp_nodelay true").
	addr := sinktest.StartMosquitto(b, strings.Split(os.Getenv("DRAIN_MOSQUITTO"), ";")...)
	st := backlogOf(b, b.N)
	up, err := mqttsink.New(mqttsink.Config{URL: "mqtt://" + addr, ClientID: "drain", Version: 5, QoS: 1})
	if err != nil {
		b.Fatal(err)
	}
	pos := &statePositions{st: st, end: uint64(b.N), done: make(chan struct{})}
	s, err := sink.New(sink.Config{Name: fmt.Sprintf("bench%d", drainRun.Add(1)), Streams: []sink.Stream{st},
		Upstream: up, Positions: pos})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.SetBytes(64)
	b.ResetTimer()
	cpu0, t0 := cpuTime(b), time.Now()
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	select {
	case <-pos.done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("drained %d of %d records in 10 minutes", s.Status().Streams[0].CommittedOffset, b.N)
	}
	elapsed, cpu := time.Since(t0), cpuTime(b)-cpu0
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/record")
}
