package edge

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/peatmq/peat/edge/mirror"
	"github.com/peatmq/peat/logstore"
)

// siteMirror is the mirror stream of the site tests: a site receiving
// site-a's default stream.
const siteMirror = "site-a.default"

// startMirrorSite starts three voters that each carry the mirror stream
// and waits until it has a full ISR.
func startMirrorSite(t *testing.T) []*Node {
	t.Helper()
	return startSite3(t, func(c *Config) {
		c.Streams = append(c.Streams, StreamConfig{Name: siteMirror, Mirror: true, Filters: []string{"site-a/#"}, Durability: "fsync"})
	})
}

// startMirrorSource starts a single node whose Peat sink mirrors its
// default stream to url, at most rate records/s (0: no limit).
func startMirrorSource(t *testing.T, url string, rate float64) *Node {
	t.Helper()
	cfg := testConfig(t)
	s := defaultSink()
	s.Name = "hq"
	s.Streams = []string{logstore.DefaultStreamName}
	s.MaxRate = rate
	s.Backoff = BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(500 * time.Millisecond)}
	s.Peat = &SinkPeatConfig{URL: url, ClientID: "site-a", MirrorAs: "site-a.{stream}",
		Topic: "site-a/{topic}", Window: siteSinkWindow, Keepalive: Duration(30 * time.Second)}
	cfg.Sinks = []SinkConfig{s}
	return startNode(t, cfg)
}

// waitMirrorEqual waits until the mirror on each of nodes holds the
// source's end records, then checks that every offset holds the
// source's record at that offset, once (no offset past the end).
func waitMirrorEqual(t *testing.T, src *Node, nodes []*Node) {
	t.Helper()
	log := src.Store().Stream(logstore.DefaultStreamName)
	end := log.NextOffset()
	want, err := log.Read(0, int(end), 64<<20)
	if err != nil || uint64(len(want)) != end {
		t.Fatalf("source: read %d of %d records: %v", len(want), end, err)
	}
	for _, n := range nodes {
		id := n.cfg.Cluster.NodeID
		m := n.Store().Stream(siteMirror)
		eventually(t, fmt.Sprintf("the mirror on %s committed up to the source's end %d", id, end), func() bool { return m.Committed() >= end })
		if got := m.NextOffset(); got != end {
			t.Fatalf("%s: the mirror ends at %d, the source at %d", id, got, end)
		}
		got, err := m.Read(0, int(end), 64<<20)
		if err != nil || uint64(len(got)) != end {
			t.Fatalf("%s: read %d of %d mirror records: %v", id, len(got), end, err)
		}
		for i := range want {
			if got[i].Offset != want[i].Offset || string(got[i].Payload) != string(want[i].Payload) || got[i].Topic != "site-a/"+want[i].Topic {
				t.Fatalf("%s: mirror offset %d holds %s %q, the source %d %s %q", id, got[i].Offset, got[i].Topic, got[i].Payload,
					want[i].Offset, want[i].Topic, want[i].Payload)
			}
		}
	}
}

// mirrorFollower is a node of nodes that does not lead the mirror.
func mirrorFollower(t *testing.T, nodes []*Node) *Node {
	t.Helper()
	ldr := leaderOf(t, nodes, siteMirror)
	for _, n := range nodes {
		if n != ldr {
			return n
		}
	}
	t.Fatal("no follower")
	return nil
}

// A Peat sink writing to a node of the receiving site that does not lead
// the mirror stream: the follower forwards each record with its source
// offset, and every replica ends up with the source's records at the
// source's offsets.
func TestCluster_MirrorThroughAFollower(t *testing.T) {
	nodes := startMirrorSite(t)
	f := mirrorFollower(t, nodes)
	src := startMirrorSource(t, "mqtt://"+f.MQTTAddr().String(), 0)
	pub := &publisher{n: src, id: "pub"}
	pub.send(t, 300, time.Minute)
	waitMirrorEqual(t, src, nodes)
	if got := testutil.ToFloat64(f.mu.mirror.Records().WithLabelValues(siteMirror, "appended")); got < 300 {
		t.Fatalf("the follower counted %v records appended, want 300 at least", got)
	}
}

// The mirror stream's leader dies mid-stream (no hand-over): the sink,
// which wrote through it, reconnects to another node; what the old leader
// had not committed is truncated or sent again, and every surviving
// replica ends up with each source record once, at its source offset.
func TestCluster_MirrorLeaderKilledMidStream(t *testing.T) {
	nodes := startMirrorSite(t)
	ldr := leaderOf(t, nodes, siteMirror)
	var others []*Node
	for _, n := range nodes {
		if n != ldr {
			others = append(others, n)
		}
	}
	px := newSwitchProxy(t, ldr.MQTTAddr().String())
	src := startMirrorSource(t, "mqtt://"+px.addr(), 150) // the kill lands mid-stream
	pub := &publisher{n: src, id: "pub"}
	pub.send(t, 400, time.Minute)
	m := ldr.Store().Stream(siteMirror)
	eventually(t, "the mirror part way", func() bool { return m.Committed() >= 60 })
	crashNode(t, ldr)
	px.retarget(others[0].MQTTAddr().String()) // the sink's next connection reaches a survivor
	if others[0].Store().Stream(siteMirror).Committed() >= 400 {
		t.Fatal("the sink mirrored everything before the kill: the test did not kill mid-stream")
	}
	at := m.Committed()
	waitNewLeader(t, others, siteMirror, ldr.cfg.Cluster.NodeID)
	pub.send(t, 50, time.Minute)
	waitMirrorEqual(t, src, others)
	rec := others[0].mu.mirror.Records()
	t.Logf("killed at mirror offset %d; %s then took %v appended, %v duplicate, %v refused", at, others[0].cfg.Cluster.NodeID,
		testutil.ToFloat64(rec.WithLabelValues(siteMirror, "appended")), testutil.ToFloat64(rec.WithLabelValues(siteMirror, "duplicate")),
		testutil.ToFloat64(rec.WithLabelValues(siteMirror, "refused")))
}

// In a site as on one node: a resend (offset below the mirror's end) is
// acknowledged without a second record, a record past the end while the
// source still holds the records between is refused, and so is an
// ordinary publish to the mirror's filter, on a follower and on the
// leader alike; a gap the source's retention made is marked on every
// replica.
func TestCluster_MirrorDuplicatesAndGaps(t *testing.T) {
	nodes := startMirrorSite(t)
	ldr := leaderOf(t, nodes, siteMirror)
	f := mirrorFollower(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func(n *Node, id string) *pahov5.Client {
		conn, err := net.Dial("tcp", n.MQTTAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c := pahov5.NewClient(pahov5.ClientConfig{Conn: conn})
		if _, err := c.Connect(ctx, &pahov5.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(&pahov5.Disconnect{}) })
		return c
	}
	publish := func(c *pahov5.Client, off, first uint64) byte {
		t.Helper()
		resp, err := c.Publish(ctx, &pahov5.Publish{Topic: mirror.Prefix + siteMirror, QoS: 1, Payload: fmt.Appendf(nil, "m%d", off),
			Properties: &pahov5.PublishProperties{User: mirrorProps(off, first)}})
		if resp == nil {
			t.Fatalf("publish offset %d: %v", off, err)
		}
		return resp.ReasonCode
	}
	viaF, viaL := dial(f, "via-follower"), dial(ldr, "via-leader")
	for _, off := range []uint64{0, 1, 1} {
		if code := publish(viaF, off, 0); code != 0 {
			t.Fatalf("offset %d through the follower: reason %#x", off, code)
		}
	}
	if code := publish(viaL, 1, 0); code != 0 {
		t.Fatalf("offset 1 again through the leader: reason %#x, want success (a resend)", code)
	}
	if code := publish(viaF, 5, 0); code != 0x80 {
		t.Errorf("offset 5 through the follower while the source still has 2..4: reason %#x, want 0x80", code)
	}
	if code := publish(viaL, 5, 0); code != 0x80 {
		t.Errorf("offset 5 through the leader while the source still has 2..4: reason %#x, want 0x80", code)
	}
	for _, c := range []*pahov5.Client{viaF, viaL} {
		resp, err := c.Publish(ctx, &pahov5.Publish{Topic: "site-a/x", QoS: 1, Payload: []byte("x")})
		if resp == nil || resp.ReasonCode != 0x90 {
			t.Errorf("an ordinary publish to the mirror's filter: %+v (%v), want reason 0x90", resp, err)
		}
	}
	if got := ldr.Store().Stream(siteMirror).NextOffset(); got != 2 {
		t.Fatalf("the leader's mirror ends at %d, want 2 (offsets 0 and 1, once each)", got)
	}
	// The source's retention dropped 2..4 before they were sent.
	if code := publish(viaF, 5, 5); code != 0 {
		t.Fatalf("offset 5 after the source dropped 2..4: reason %#x", code)
	}
	for result, want := range map[string]float64{"appended": 3, "duplicate": 1, "refused": 1, "gap": 3} {
		if got := testutil.ToFloat64(f.mu.mirror.Records().WithLabelValues(siteMirror, result)); got != want {
			t.Errorf("the follower's peat_mirror_records_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	for _, n := range nodes {
		id := n.cfg.Cluster.NodeID
		m := n.Store().Stream(siteMirror)
		eventually(t, id+" to commit the mirror's 6 offsets", func() bool { return m.Committed() >= 6 })
		recs, err := m.Read(0, 0, 0)
		if err != nil || len(recs) != 6 || m.NextOffset() != 6 {
			t.Fatalf("%s: the mirror holds %d records up to %d (%v), want 6", id, len(recs), m.NextOffset(), err)
		}
		for i, r := range recs {
			gap := i >= 2 && i <= 4
			switch {
			case r.Offset != uint64(i):
				t.Fatalf("%s: record %d at offset %d", id, i, r.Offset)
			case gap && (r.Topic != mirror.GapTopic || r.UserProperties[0].Value != "2-5"):
				t.Fatalf("%s: offset %d: %+v, want a gap marker 2-5", id, i, r)
			case !gap && (r.Topic != "sensors/a" || string(r.Payload) != fmt.Sprintf("m%d", i)):
				t.Fatalf("%s: offset %d: %s %q, want the source's record", id, i, r.Topic, r.Payload)
			}
		}
	}
}

// switchProxy forwards TCP connections to a target that the test can
// change: retarget cuts the connections open and sends the next ones to
// the new target (a client that knows one address, reaching another node).
type switchProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *switchProxy) addr() string { return p.ln.Addr().String() }

func (p *switchProxy) retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	p.cut()
}

func (p *switchProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *switchProxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		out, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Add(2)
		go pipe(in, out)
		go pipe(out, in)
	}
}
