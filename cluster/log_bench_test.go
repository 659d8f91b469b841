package cluster

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/peatmq/peat/logstore"
)

// BenchmarkLog_AcksAll is W5 in one process: a stream on three replicas
// (the ISR of three, min_insync_replicas 2), appends of one 128-byte
// record each, inFlight of them outstanding at a time (160: as W5's
// publishers keep them; 1: the latency of one acknowledgement alone), answered once committed (acks=all). It reports the rate and
// the latency of an acknowledgement; -cpuprofile shows the CPU of all
// three nodes. The stores are on the working directory's disk (not a
// tmpfs), whose fsyncs are the cost being measured.
func BenchmarkLog_AcksAll(b *testing.B) {
	for _, inFlight := range []int{1, 160} {
		b.Run(fmt.Sprintf("inflight=%d", inFlight), func(b *testing.B) { benchAcksAll(b, inFlight) })
	}
}

func benchAcksAll(b *testing.B, inFlight int) {
	var dirs []string
	for range 3 {
		dir, err := os.MkdirTemp(".", "bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
		dirs = append(dirs, dir)
	}
	nodes := newTestSite(b, siteOpts{Dirs: dirs, MinISR: 2}.forLog()).nodes
	eventually(b, "a controller", func() bool { return nodes[0].Node.Controller() != "" })
	var ctl *testNode
	for _, n := range nodes {
		if n.Node.IsController() {
			ctl = n
		}
	}
	if ctl == nil {
		b.Fatal("no controller")
	}
	createStreams(b, nodes[0], []string{"n1", "n2", "n3"}, "s")
	s := nodes[0].Log.Stream("s")
	eventually(b, "a full ISR", func() bool {
		st, _ := nodes[0].Node.State()
		ss := st.Streams["s"]
		return ss != nil && len(ss.ISR) == 3
	})
	payload := make([]byte, 128)

	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs int
	)
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := cpuTime(b)
	start := time.Now()
	for i := range b.N {
		slots <- struct{}{}
		wg.Add(1)
		at := time.Now()
		s.AppendAsync([]*logstore.Record{{Topic: fmt.Sprintf("s/%d", i%10), QoS: 1, Payload: payload}}, func(_ uint64, err error) {
			d := time.Since(at)
			mu.Lock()
			lat = append(lat, d)
			if err != nil {
				errs++
			}
			mu.Unlock()
			<-slots
			wg.Done()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime(b) - cpu0
	b.StopTimer()
	if errs > 0 {
		b.Fatalf("%d of %d appends refused", errs, b.N)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acks/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/ack") // the three nodes' together
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
