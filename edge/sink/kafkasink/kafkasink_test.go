package kafkasink_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/kafkasink"
	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// positions keeps positions in memory; after freeze it acknowledges
// commits without keeping them, as a node that crashed before its
// position reached the disk.
type positions struct {
	mu     sync.Mutex
	m      map[string]uint64
	frozen atomic.Bool
}

func (p *positions) Load(group, stream string) (uint64, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	off, ok := p.m[group+"/"+stream]
	return off, ok, nil
}

func (p *positions) Commit(group, stream string, off uint64) error {
	if p.frozen.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[group+"/"+stream] = off
	return nil
}

func (p *positions) get() uint64 {
	off, _, _ := p.Load(sink.Group("lake"), "default")
	return off
}

func appendN(t testing.TB, s *mqtttest.MemStream, n int) {
	t.Helper()
	// An hour old: a backlog older than the delivery timeout must still go.
	old := time.Now().Add(-time.Hour).UnixMilli()
	recs := make([]*logstore.Record, n)
	for i := range recs {
		recs[i] = &logstore.Record{Topic: fmt.Sprintf("sensors/%d", i%7), QoS: 1, Payload: []byte("x"), Timestamp: old}
	}
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// runSink runs a sink of the stream to the cluster until the returned
// stop is called (or the test ends).
func runSink(t *testing.T, brokers []string, st sink.Stream, pos sink.Positions, exactlyOnce bool) (*sink.Sink, func()) {
	t.Helper()
	up, err := kafkasink.New(kafkasink.Config{
		Brokers: brokers, Topic: "edge.{stream}", Key: "{topic}", Site: "site-a", SinkName: "lake",
		ExactlyOnce: exactlyOnce, Window: 32, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var logger *slog.Logger
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	s, err := sink.New(sink.Config{Name: "lake", Streams: []sink.Stream{st}, Upstream: up, Positions: pos,
		BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return s, stop
}

// readBack returns how many times each edge offset of site-a's stream
// "default" is in the topic (committed records only), once want distinct
// offsets are there.
func readBack(t *testing.T, brokers []string, want int) map[uint64]int {
	t.Helper()
	return readBackStream(t, brokers, "default", want)
}

// readBackStream is readBack for site-a's stream in topic edge.<stream>.
func readBackStream(t *testing.T, brokers []string, stream string, want int) map[uint64]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("edge."+stream),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[uint64]int{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read back %d distinct offsets of %d", len(got), want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			if h[kafkasink.HeaderSite] != "site-a" || h[kafkasink.HeaderStream] != stream {
				t.Errorf("record without the site and stream headers: %v", h)
			}
			off, err := strconv.ParseUint(h[kafkasink.HeaderOffset], 10, 64)
			if err != nil {
				t.Errorf("record with peat-offset %q", h[kafkasink.HeaderOffset])
			}
			got[off]++
		})
	}
	// Whatever else is there arrives with the next fetch.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	cl.PollFetches(short).EachRecord(func(r *kgo.Record) {
		for _, x := range r.Headers {
			if x.Key == kafkasink.HeaderOffset {
				off, _ := strconv.ParseUint(string(x.Value), 10, 64)
				got[off]++
			}
		}
	})
	return got
}

func checkExactlyOnce(t *testing.T, got map[uint64]int, n int) {
	t.Helper()
	dups := 0
	for off := 0; off < n; off++ {
		switch c := got[uint64(off)]; {
		case c == 0:
			t.Errorf("edge offset %d missing upstream", off)
		case c > 1:
			dups += c - 1
		}
	}
	if dups > 0 {
		t.Errorf("%d duplicates by edge offset", dups)
	}
	if len(got) != n {
		t.Errorf("%d distinct offsets upstream, want %d", len(got), n)
	}
}

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, "edge.default")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// A node that crashed after Kafka committed records but before its own
// position was stored resumes after the highest edge offset found in the
// topic: nothing twice, nothing missing.
func TestKafkaSink_ExactlyOnceResumesFromTheOutput(t *testing.T) {
	c := newCluster(t)
	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	const n = 3000
	appendN(t, st, n)
	pos := &positions{m: map[string]uint64{}}

	_, stop := runSink(t, c.ListenAddrs(), st, pos, true)
	sinktest.WaitFor(t, "some progress", time.Minute, func() bool { return pos.get() > 500 })
	pos.frozen.Store(true) // from here on the node "loses" its commits
	stale := pos.get()
	time.Sleep(300 * time.Millisecond) // let more transactions commit upstream (the point of the test)
	stop()
	pos.frozen.Store(false)
	t.Logf("position stored %d; the sink had gone on without storing it", stale)

	runSink(t, c.ListenAddrs(), st, pos, true)
	sinktest.WaitFor(t, "the position at the end", time.Minute, func() bool { return pos.get() == n })
	checkExactlyOnce(t, readBack(t, c.ListenAddrs(), n), n)
}

// The fake cluster goes away mid-drain and comes back on the same port
// and data: the sink waits, reconnects and finishes, exactly once.
func TestKafkaSink_ClusterOutage(t *testing.T) {
	dir := t.TempDir()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "edge.default"), kfake.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	addrs := c.ListenAddrs()
	_, portStr, _ := net.SplitHostPort(addrs[0])
	port, _ := strconv.Atoi(portStr)

	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	const n = 3000
	appendN(t, st, n)
	pos := &positions{m: map[string]uint64{}}
	s, _ := runSink(t, addrs, st, pos, true)
	sinktest.WaitFor(t, "some progress", time.Minute, func() bool { return pos.get() > 300 })
	c.Close()
	// Records acknowledged before the close may still be committed: the
	// sink commits a quarter window at a time. Then nothing may move.
	time.Sleep(500 * time.Millisecond)
	at := pos.get()
	time.Sleep(time.Second) // the sink retries against nothing meanwhile
	if got := s.Status().State; got == sink.StateConnected && pos.get() != at {
		t.Errorf("the sink made progress with the cluster down")
	}
	c2, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "edge.default"), kfake.DataDir(dir), kfake.Ports(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c2.Close)
	sinktest.WaitFor(t, "the position at the end", time.Minute, func() bool { return pos.get() == n })
	checkExactlyOnce(t, readBack(t, c2.ListenAddrs(), n), n)
}

// Without exactly_once the sink still delivers everything (idempotent
// producer, at least once).
func TestKafkaSink_AtLeastOnce(t *testing.T) {
	c := newCluster(t)
	st := mqtttest.NewMemLog(t, "default=#").Stream(t, "default")
	const n = 1000
	appendN(t, st, n)
	pos := &positions{m: map[string]uint64{}}
	runSink(t, c.ListenAddrs(), st, pos, false)
	sinktest.WaitFor(t, "the position at the end", time.Minute, func() bool { return pos.get() == n })
	checkExactlyOnce(t, readBack(t, c.ListenAddrs(), n), n)
}

// A stream added to a running exactly-once sink (as a sink of every
// stream follows a new one) starts after what Kafka already holds of it,
// as the streams the sink starts with do: records an earlier run sent
// there before it crashed, without storing its position, are not sent
// twice.
func TestKafkaSink_ExactlyOnceAddedStreamResumesFromTheOutput(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(3, "edge.meters"))
	log := mqtttest.NewMemLog(t, "default=#", "meters=meters/#")
	def, meters := log.Stream(t, "default"), log.Stream(t, "meters")
	const n = 3000
	appendN(t, meters, n)
	appendN(t, def, 100)
	pos := &positions{m: map[string]uint64{}}
	metersPos := func() uint64 {
		off, _, _ := pos.Load(sink.Group("lake"), "meters")
		return off
	}

	// An earlier run sent part of meters and crashed with an older
	// position stored.
	_, stop := runSink(t, c.ListenAddrs(), meters, pos, true)
	sinktest.WaitFor(t, "some progress in meters", time.Minute, func() bool { return metersPos() > 500 })
	pos.frozen.Store(true)
	stale := metersPos()
	time.Sleep(300 * time.Millisecond) // more transactions commit upstream meanwhile
	stop()
	pos.frozen.Store(false)
	t.Logf("meters' position stored %d; the sink had gone on without storing it", stale)

	// This run starts with default only, and meters comes while it is
	// connected.
	s, _ := runSink(t, c.ListenAddrs(), def, pos, true)
	sinktest.WaitFor(t, "default sent", time.Minute, func() bool { return pos.get() == 100 })
	if err := s.AddStream(meters); err != nil {
		t.Fatal(err)
	}
	sinktest.WaitFor(t, "meters' position at the end", time.Minute, func() bool { return metersPos() == n })
	checkExactlyOnce(t, readBackStream(t, c.ListenAddrs(), "meters", n), n)
}
