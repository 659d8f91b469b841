package peatsource_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge"
	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/peatsource"
	"github.com/peatmq/peat/edge/source/sourcetest"
	"github.com/peatmq/peat/logstore"
)

func logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

func nodeConfig(t *testing.T, dir string, streams ...edge.StreamConfig) edge.Config {
	cfg := edge.DefaultConfig()
	cfg.DataDir = dir
	cfg.MQTT.Listen = "127.0.0.1:0"
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.Storage.Profile = string(logstore.ProfileServer)
	cfg.Streams = append(cfg.Streams, streams...)
	return cfg
}

func startNode(t *testing.T, cfg edge.Config) (*edge.Node, func()) {
	t.Helper()
	n, err := edge.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := n.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return n, stop
}

// publish publishes values from..to-1 to topic at addr, QoS 1, in order.
func publish(t *testing.T, addr, topic string, from, to int) {
	t.Helper()
	if err := publishE(addr, topic, from, to); err != nil {
		t.Fatal(err)
	}
}

func publishE(addr, topic string, from, to int) error {
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).
		SetClientID(fmt.Sprintf("pub-%d", time.Now().UnixNano())).SetAutoReconnect(false).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		return fmt.Errorf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	var toks []paho.Token
	for i := from; i < to; i++ {
		toks = append(toks, c.Publish(topic, 1, false, strconv.Itoa(i)))
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(time.Minute) || tok.Error() != nil {
			return fmt.Errorf("publish: %v", tok.Error())
		}
	}
	return nil
}

// runSource runs a peat source from hq into the site's mirror stream
// "hq" until the returned stop.
func runSource(t *testing.T, site *edge.Node, hqAddr string, cfg peatsource.Config) (*source.Source, func()) {
	t.Helper()
	cfg.URL, cfg.ClientID, cfg.Logger = "mqtt://"+hqAddr, "site-a-down", logger()
	cfg.Window = 64
	up, err := peatsource.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	store := site.Store()
	apply := func(ctx context.Context, stream string, in []mirror.Incoming) ([]mirror.Result, []error) {
		return mirror.Apply(ctx, store.Stream(stream), 0, in)
	}
	s, err := source.New(source.Config{
		Name: "hq", Kind: "peat", Stream: "hq",
		Log:        peatsource.MirrorLog(sourcetest.StoreLog{St: store}, "hq", apply, logger()),
		Upstream:   up,
		Marks:      &sourcetest.Marks{},
		BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Logger: logger(),
	})
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

// records reads every record of the site's mirror stream.
func records(t *testing.T, st *logstore.Stream) []*logstore.Record {
	t.Helper()
	var out []*logstore.Record
	for from := st.FirstOffset(); from < st.Committed(); {
		recs, err := st.Read(from, 1000, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		out = append(out, recs...)
		from = recs[len(recs)-1].Offset + 1
	}
	return out
}

// checkSameOffsets checks that the mirror holds HQ's stream at HQ's
// offsets: value i at offset i, each once.
func checkSameOffsets(t *testing.T, mirrorSt, hqSt *logstore.Stream, n int) {
	t.Helper()
	hq := records(t, hqSt)
	got := records(t, mirrorSt)
	if len(got) != n || len(hq) != n {
		t.Fatalf("mirror holds %d records, hq %d, want %d", len(got), len(hq), n)
	}
	for i, r := range got {
		h := hq[i]
		if r.Offset != h.Offset || string(r.Payload) != string(h.Payload) || r.Topic != "hq/"+h.Topic || r.Timestamp != h.Timestamp ||
			r.QoS != h.QoS || r.ClientID != h.ClientID {
			t.Fatalf("mirror record %d: offset %d %q %q t%d q%d from %q; hq: offset %d %q %q t%d q%d from %q", i,
				r.Offset, r.Topic, r.Payload, r.Timestamp, r.QoS, r.ClientID, h.Offset, h.Topic, h.Payload, h.Timestamp, h.QoS, h.ClientID)
		}
		if source.Of(r) != "hq" {
			t.Errorf("record %d without the source's name: %v", i, r.UserProperties)
		}
	}
}

// Records published at HQ appear in the site's mirror stream at the same
// offsets; a site restarted (source and node) resumes at the mirror's log
// end: no record twice, none missing.
func TestPeatSource_MirrorsAtTheSameOffsetsAcrossRestarts(t *testing.T) {
	hq, _ := startNode(t, nodeConfig(t, t.TempDir()))
	hqAddr := hq.MQTTAddr().String()
	siteDir := t.TempDir()
	siteCfg := nodeConfig(t, siteDir, edge.StreamConfig{Name: "hq", Mirror: true, Filters: []string{"hq/#"}, Durability: "fsync"})
	site, stopSite := startNode(t, siteCfg)

	const n = 3000
	publish(t, hqAddr, "cmd/dev1", 0, n/3)
	_, stop := runSource(t, site, hqAddr, peatsource.Config{Topic: "hq/{topic}", Stream: "default"})
	mirrorOf := func(s *edge.Node) *logstore.Stream { return s.Store().Stream("hq") }
	sinktest.WaitFor(t, "history mirrored", time.Minute, func() bool { return mirrorOf(site).Committed() == n/3 })
	publish(t, hqAddr, "cmd/dev2", n/3, n/2) // live
	sinktest.WaitFor(t, "live records mirrored", time.Minute, func() bool { return mirrorOf(site).Committed() == n/2 })
	checkSameOffsets(t, mirrorOf(site), hq.Store().Stream("default"), n/2)

	// The source stops in the middle of a stream of publishes, the node
	// too; HQ goes on meanwhile.
	pubErr := make(chan error, 1)
	go func() { pubErr <- publishE(hqAddr, "cmd/dev3", n/2, 3*n/4) }()
	sinktest.WaitFor(t, "some of the next records", time.Minute, func() bool { return mirrorOf(site).Committed() > n/2 })
	stop()
	stopSite()
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	publish(t, hqAddr, "cmd/dev4", 3*n/4, n)

	site, _ = startNode(t, siteCfg)
	at := mirrorOf(site).Committed()
	t.Logf("site restarted with %d of %d", at, n)
	src, _ := runSource(t, site, hqAddr, peatsource.Config{Topic: "hq/{topic}", Stream: "default"})
	sinktest.WaitFor(t, "everything mirrored", time.Minute, func() bool { return mirrorOf(site).Committed() == n })
	time.Sleep(200 * time.Millisecond) // nothing more may come
	checkSameOffsets(t, mirrorOf(site), hq.Store().Stream("default"), n)
	// The replay started at the mirror's end: nothing it held came again.
	if got := src.Status().Received; got != n-at {
		t.Errorf("the restarted source received %d records, want the %d after the mirror's end", got, n-at)
	}
}

// A replay filter narrower than HQ's stream leaves out the records it does
// not match: their offsets become gap markers, and every record after them
// is at its HQ offset.
func TestPeatSource_OffsetsTheReplaySkipsAreGapMarkers(t *testing.T) {
	hq, _ := startNode(t, nodeConfig(t, t.TempDir()))
	hqAddr := hq.MQTTAddr().String()
	site, _ := startNode(t, nodeConfig(t, t.TempDir(), edge.StreamConfig{Name: "hq", Mirror: true, Filters: []string{"hq/#"}}))
	publish(t, hqAddr, "cmd/a", 0, 5)
	publish(t, hqAddr, "other/b", 5, 8)
	publish(t, hqAddr, "cmd/a", 8, 10)
	_, _ = runSource(t, site, hqAddr, peatsource.Config{Topic: "hq/{topic}", Filter: "cmd/#"})
	st := site.Store().Stream("hq")
	sinktest.WaitFor(t, "mirrored", time.Minute, func() bool { return st.Committed() == 10 })
	for _, r := range records(t, st) {
		switch {
		case r.Offset >= 5 && r.Offset < 8:
			if r.Topic != mirror.GapTopic {
				t.Errorf("offset %d: %q, want a gap marker", r.Offset, r.Topic)
			}
		case r.Topic != "hq/cmd/a" || string(r.Payload) != strconv.Itoa(int(r.Offset)):
			t.Errorf("offset %d: %q %q", r.Offset, r.Topic, r.Payload)
		}
	}
}

// A replay filter that reaches another stream upstream than the one the
// config names is refused at connect, not mirrored.
func TestPeatSource_RefusesAnotherUpstreamStream(t *testing.T) {
	hq, _ := startNode(t, nodeConfig(t, t.TempDir(), edge.StreamConfig{Name: "cmds", Filters: []string{"cmd/#"}}))
	up, err := peatsource.New(peatsource.Config{URL: "mqtt://" + hq.MQTTAddr().String(), ClientID: "site", Filter: "sensors/#", Stream: "cmds"})
	if err != nil {
		t.Fatal(err)
	}
	site, _ := startNode(t, nodeConfig(t, t.TempDir(), edge.StreamConfig{Name: "hq", Mirror: true, Filters: []string{"hq/#"}}))
	_, err = up.Connect(context.Background(), fixedEnd{site.Store().Stream("hq")})
	if err == nil || !strings.Contains(err.Error(), `reaches stream "default" upstream, not "cmds"`) {
		t.Errorf("Connect: %v, want the stream named", err)
	}
	if source.Reason(err) != "refused" {
		t.Errorf("reason %q, want refused", source.Reason(err))
	}
}

// fixedEnd is a Resume of a stream that only answers End.
type fixedEnd struct{ st *logstore.Stream }

func (r fixedEnd) Stream() string                                                  { return r.st.Name() }
func (r fixedEnd) End() uint64                                                     { return r.st.Committed() }
func (r fixedEnd) WaitCommitted(context.Context) error                             { return nil }
func (r fixedEnd) Mark() (uint64, bool, error)                                     { return 0, false, nil }
func (r fixedEnd) SetMark(uint64) error                                            { return nil }
func (r fixedEnd) Scan(context.Context, uint64, func(*logstore.Record) bool) error { return nil }
