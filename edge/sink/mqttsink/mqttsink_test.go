package mqttsink_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/mqttsink"
	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest"
)

// memPositions keeps positions in memory.
type memPositions struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (p *memPositions) Load(group, stream string) (uint64, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	off, ok := p.m[group+"/"+stream]
	return off, ok, nil
}

func (p *memPositions) Commit(group, stream string, off uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]uint64{}
	}
	p.m[group+"/"+stream] = off
	return nil
}

// appendN appends n records to s with payloads of their offsets (the
// offsets are those of the appends in order from the stream's end).
func appendN(t testing.TB, s *mqtttest.MemStream, topic string, n int) {
	t.Helper()
	recs := make([]*logstore.Record, n)
	for i := range recs {
		recs[i] = &logstore.Record{Topic: topic, QoS: 1}
	}
	done := make(chan error, 1)
	s.AppendAsync(recs, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// offsetStream is a MemStream whose records carry their offset as payload,
// so the upstream shows which record arrived.
type offsetStream struct{ *mqtttest.MemStream }

func (s offsetStream) Read(from uint64, max, maxBytes int) ([]*logstore.Record, error) {
	recs, err := s.MemStream.Read(from, max, maxBytes)
	out := make([]*logstore.Record, len(recs))
	for i, r := range recs {
		c := *r
		c.Payload = []byte(strconv.FormatUint(r.Offset, 10))
		out[i] = &c
	}
	return out, err
}

type rig struct {
	t    *testing.T
	log  *mqtttest.MemLog
	st   *mqtttest.MemStream
	pos  *memPositions
	sink *sink.Sink
	stop func()
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// newRig runs a sink of the stream "default" to the MQTT broker at addr.
func newRig(t *testing.T, addr string, mc mqttsink.Config, sc sink.Config) *rig {
	t.Helper()
	r := &rig{t: t, log: mqtttest.NewMemLog(t, "default=#"), pos: &memPositions{}}
	r.st = r.log.Stream(t, "default")
	mc.URL = "mqtt://" + addr
	if mc.ClientID == "" {
		mc.ClientID = "site-" + t.Name()
	}
	if mc.Version == 0 {
		mc.Version = 5
	}
	up, err := mqttsink.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	sc.Name, sc.Upstream, sc.Positions = "cloud", up, r.pos
	sc.Streams = []sink.Stream{offsetStream{r.st}}
	if sc.BackoffMin == 0 {
		sc.BackoffMin, sc.BackoffMax = 50*time.Millisecond, 200*time.Millisecond
	}
	if sc.Logger == nil {
		sc.Logger = testLogger(t)
	}
	r.sink, err = sink.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.sink.Run(ctx) }()
	r.stop = func() { cancel(); <-done }
	t.Cleanup(r.stop)
	return r
}

func (r *rig) position() uint64 {
	off, _, _ := r.pos.Load(sink.Group("cloud"), "default")
	return off
}

func TestMQTTSink_DrainsBacklogInOrder(t *testing.T) {
	for _, v := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			addr := sinktest.StartMosquitto(t)
			col := sinktest.NewCollector(t, addr, "site/#")
			r := newRig(t, addr, mqttsink.Config{Version: v, Window: 32, Topic: "site/{topic}"}, sink.Config{})
			const n = 3000
			appendN(t, r.st, "sensors/a", n) // a backlog the sink finds at once
			sinktest.WaitFor(t, "the sink's position at the end", time.Minute, func() bool { return r.position() == n })
			sinktest.WaitFor(t, "every record upstream", time.Minute, func() bool { return col.HasOffsets(n) })
			if dups := sinktest.CheckInOrder(t, col.Payloads(), n, 32); dups != 0 {
				t.Errorf("%d duplicates without a fault", dups)
			}
			if st := r.sink.Status(); st.State != sink.StateConnected || st.Streams[0].LagRecords != 0 {
				t.Errorf("status %+v, want connected with no lag", st)
			}
		})
	}
}

// TestMQTTSink_Faults runs a drain through each fault of the proxy.
func TestMQTTSink_Faults(t *testing.T) {
	const window = 16
	for _, tc := range []struct {
		name  string
		mode  int32
		delay time.Duration
	}{
		{"reset", sinktest.ModeReset, 0},
		{"blackhole", sinktest.ModeBlackHole, 0},
		{"delay", sinktest.ModeDelay, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := sinktest.StartMosquitto(t)
			col := sinktest.NewCollector(t, addr, "site/#")
			px := sinktest.NewProxy(t, addr, tc.delay)
			stallAfter := 1500 * time.Millisecond
			r := newRig(t, px.Addr(), mqttsink.Config{Window: window, Topic: "site/{topic}", Keepalive: 2 * time.Second},
				sink.Config{StallAfter: stallAfter})
			const n = 4000
			appendN(t, r.st, "sensors/a", n/2)
			sinktest.WaitFor(t, "some progress", time.Minute, func() bool { return r.position() > 100 })

			px.SetMode(tc.mode)
			faultAt := time.Now()
			appendN(t, r.st, "sensors/a", n/2) // traffic keeps coming during the fault
			switch tc.mode {
			case sinktest.ModeBlackHole:
				// Nothing is acknowledged: the sink must say so within
				// stall_after (plus the monitor's tick and a noisy machine).
				sinktest.WaitFor(t, "state stalled", stallAfter+20*time.Second, func() bool {
					return r.sink.Status().State == sink.StateStalled
				})
				t.Logf("stalled after %v", time.Since(faultAt).Round(time.Millisecond))
				time.Sleep(time.Second) // a while in the hole (not an assertion)
			case sinktest.ModeReset:
				sinktest.WaitFor(t, "a reset connection retried", 30*time.Second, func() bool { return px.Conns.Load() >= 3 })
			}
			px.SetMode(sinktest.ModePass)

			sinktest.WaitFor(t, "the sink's position at the end", time.Minute, func() bool { return r.position() == n })
			sinktest.WaitFor(t, "every record upstream", time.Minute, func() bool { return col.HasOffsets(n) })
			dups := sinktest.CheckInOrder(t, col.Payloads(), n, window)
			t.Logf("%d messages upstream, %d duplicates, %d connections", len(col.Payloads()), dups, px.Conns.Load())
			if tc.mode == sinktest.ModeDelay && dups != 0 {
				t.Errorf("%d duplicates with only a delay", dups)
			}
			sinktest.WaitFor(t, "state connected", 30*time.Second, func() bool { return r.sink.Status().State == sink.StateConnected })
		})
	}
}

func TestMQTTSink_HonoursReceiveMaximum(t *testing.T) {
	addr := sinktest.StartMosquitto(t, "max_inflight_messages 5") // mosquitto announces it as Receive Maximum
	col := sinktest.NewCollector(t, addr, "site/#")
	px := sinktest.NewProxy(t, addr, 10*time.Millisecond)
	px.SetMode(sinktest.ModeDelay) // acks come late: a sink that ignored the limit would have 64 out
	r := newRig(t, px.Addr(), mqttsink.Config{Window: 64, Topic: "site/{topic}"}, sink.Config{})
	const n = 400
	appendN(t, r.st, "sensors/a", n)
	sinktest.WaitFor(t, "the sink's position at the end", time.Minute, func() bool { return r.position() == n })
	sinktest.WaitFor(t, "every record upstream", time.Minute, func() bool { return col.HasOffsets(n) })
	sinktest.CheckInOrder(t, col.Payloads(), n, 5)
	if got := px.MaxOutstanding.Load(); got != 5 {
		t.Errorf("at most %d PUBLISHes were unacknowledged, want the upstream's Receive Maximum 5", got)
	}
	if got := r.sink.Status().Window; got != 5 {
		t.Errorf("status window %d, want 5", got)
	}
	if c := px.Conns.Load(); c != 1 {
		t.Errorf("%d connections, want 1 (the upstream disconnects a client over its Receive Maximum)", c)
	}
}

func TestMQTTSink_TopicTemplateAndProperties(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	sub := mqtttest.Dial(t, addr, mqtttest.Connect{ClientID: "props", Version: 5, Clean: true})
	sub.Subscribe("site-a/#", 1)
	r := newRig(t, addr, mqttsink.Config{Topic: "site-a/{stream}/{node}/{topic}", Node: "pi7", Properties: true}, sink.Config{})
	rec := &logstore.Record{Topic: "sensors/t", QoS: 1, ContentType: "text/plain",
		ResponseTopic: "replies/t", CorrelationData: []byte("c-1"),
		UserProperties: []logstore.UserProperty{{Key: "unit", Value: "C"}}}
	done := make(chan error, 1)
	r.st.AppendAsync([]*logstore.Record{{Topic: "sensors/skip", QoS: 1}, rec}, func(_ uint64, err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		topic, offset string
	}{{"site-a/default/pi7/sensors/skip", "0"}, {"site-a/default/pi7/sensors/t", "1"}} {
		pk := sub.ReadUntil(packets.Publish)
		sub.Puback(pk.PacketID)
		if pk.TopicName != want.topic {
			t.Errorf("topic %q, want %q", pk.TopicName, want.topic)
		}
		props := map[string]string{}
		for _, u := range pk.Properties.User {
			props[u.Key] = u.Val
		}
		if props["peat-stream"] != "default" || props["peat-offset"] != want.offset || props["peat-time"] == "" {
			t.Errorf("user properties %v, want peat-stream default, peat-offset %s, peat-time", props, want.offset)
		}
		if want.offset == "1" && (props["unit"] != "C" || pk.Properties.ContentType != "text/plain" ||
			pk.Properties.ResponseTopic != "replies/t" || string(pk.Properties.CorrelationData) != "c-1") {
			t.Errorf("the record's own properties were not kept: %+v", pk.Properties)
		}
	}
}

func TestMQTTSink_FilterSkipsButAdvances(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, addr, "#")
	r := newRig(t, addr, mqttsink.Config{}, sink.Config{Filter: "keep/#"})
	appendN(t, r.st, "drop/x", 5)
	appendN(t, r.st, "keep/x", 3)
	appendN(t, r.st, "drop/x", 5)
	sinktest.WaitFor(t, "the position past every record", 30*time.Second, func() bool { return r.position() == 13 })
	sinktest.WaitFor(t, "the kept records", 30*time.Second, func() bool { return len(col.Payloads()) >= 3 })
	time.Sleep(200 * time.Millisecond) // nothing else may come (not a timing assertion: a late one fails below)
	if got := col.Payloads(); fmt.Sprint(got) != "[5 6 7]" {
		t.Errorf("upstream got %v, want [5 6 7]", got)
	}
}

func TestMQTTSink_RetentionLossIsCountedAndSkipped(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, addr, "#")
	pos := &memPositions{}
	log := mqtttest.NewMemLog(t, "default=#")
	st := log.Stream(t, "default")
	appendN(t, st, "a", 10)
	// The sink was at 2 when it stopped; retention then dropped 0..5.
	_ = pos.Commit(sink.Group("cloud"), "default", 2)
	st.Trim(6)
	up, err := mqttsink.New(mqttsink.Config{URL: "mqtt://" + addr, ClientID: "loss", Version: 5})
	if err != nil {
		t.Fatal(err)
	}
	m := sink.NewMetrics(nil)
	s, err := sink.New(sink.Config{Name: "cloud", Streams: []sink.Stream{offsetStream{st}}, Upstream: up, Positions: pos, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	sinktest.WaitFor(t, "the rest upstream", 30*time.Second, func() bool { return len(col.Payloads()) >= 4 })
	if got := fmt.Sprint(col.Payloads()); got != "[6 7 8 9]" {
		t.Errorf("upstream got %v, want [6 7 8 9]", got)
	}
	if lost := testutil.ToFloat64(m.Lost.WithLabelValues("cloud", "default")); lost != 4 {
		t.Errorf("lost counter %v, want 4 (offsets 2 to 5)", lost)
	}
}

func TestMQTTSink_PauseStopsSending(t *testing.T) {
	addr := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, addr, "#")
	r := newRig(t, addr, mqttsink.Config{}, sink.Config{})
	appendN(t, r.st, "a", 3)
	sinktest.WaitFor(t, "first records", 30*time.Second, func() bool { return r.position() == 3 })
	r.sink.Pause()
	appendN(t, r.st, "a", 3)
	sinktest.WaitFor(t, "state paused", 30*time.Second, func() bool { return r.sink.Status().State == sink.StatePaused })
	time.Sleep(300 * time.Millisecond) // a paused sink sends nothing meanwhile (checked below)
	if got := len(col.Payloads()); got != 3 || r.position() != 3 {
		t.Fatalf("paused sink: upstream has %d, position %d; want 3 and 3", got, r.position())
	}
	r.sink.Resume()
	sinktest.WaitFor(t, "the rest after resume", 30*time.Second, func() bool { return r.position() == 6 && len(col.Payloads()) == 6 })
}

// With QoS 2 the session is resumed after a reset or a black hole: the
// messages in flight are completed under their packet ids, and the
// upstream gets every record exactly once.
func TestMQTTSink_QoS2ExactlyOnceAcrossFaults(t *testing.T) {
	const window = 16
	for _, tc := range []struct {
		name    string
		mode    int32
		version byte
	}{
		{"reset/v5", sinktest.ModeReset, 5},
		{"blackhole/v4", sinktest.ModeBlackHole, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := sinktest.StartMosquitto(t)
			col := sinktest.NewCollector(t, addr, "site/#")
			px := sinktest.NewProxy(t, addr, 0)
			r := newRig(t, px.Addr(), mqttsink.Config{QoS: 2, Version: tc.version, Window: window, Topic: "site/{topic}",
				Keepalive: 2 * time.Second}, sink.Config{StallAfter: time.Second})
			const n = 4000
			appendN(t, r.st, "sensors/a", n)
			for i, at := range []uint64{n / 4, n / 2, 3 * n / 4} {
				sinktest.WaitFor(t, "progress", time.Minute, func() bool { return r.position() > at })
				px.SetMode(tc.mode)
				sinktest.WaitFor(t, "a new connection", time.Minute, func() bool { return px.Conns.Load() >= int64(i+2) })
				px.SetMode(sinktest.ModePass)
			}
			sinktest.WaitFor(t, "the sink's position at the end", time.Minute, func() bool { return r.position() == n })
			sinktest.WaitFor(t, "every record upstream", time.Minute, func() bool { return col.HasOffsets(n) })
			time.Sleep(200 * time.Millisecond) // a late duplicate would arrive meanwhile (checked below)
			if dups := sinktest.CheckInOrder(t, col.Payloads(), n, window); dups != 0 {
				t.Errorf("%d duplicates with QoS 2 over %d connections", dups, px.Conns.Load())
			}
			t.Logf("%d connections", px.Conns.Load())
		})
	}
}
