package sitetest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// mirrorRecords is how many records the source's producer publishes.
const mirrorRecords = 4000

// mirrorRate is the source sink's max_rate (records/s): the drain takes
// seconds, so the kill lands in the middle of it.
const mirrorRate = 1000

// A source Peat (one node) mirrors its default stream through a peat sink
// into a three-node site, and the mirror stream's leader in the site is
// killed with kill -9 twice while the sink drains: first the node the
// sink writes to (its connection dies with the leader, and it reconnects
// to a survivor), then, with the sink moved to a follower, a leader the
// follower forwards to (the forwards in flight are refused). Once the
// sink's position reaches the source's end, each surviving replica holds
// every source record exactly once, at its source offset, with its topic
// and payload (so the replicas are identical), and the killed nodes,
// restarted, catch up to the same content.
func TestSite_MirrorLeaderKill(t *testing.T) {
	needSite(t)
	mst := streamSpec{"site-a.default", "site-a/#"}
	s := newSiteMirrors(t, 3, 0, []streamSpec{mst})
	door := newFrontDoor(t, s, s.leader(mst.name))
	src := startSource(t, door.addr())
	stop, produced := make(chan struct{}), make(chan struct{})
	var prodErr error
	go func() { // owned by this test: ends after N publishes or on stop
		defer close(produced)
		prodErr = publishN(src.mqtt, mirrorRecords, stop)
	}()
	t.Cleanup(func() {
		close(stop)
		<-produced
	})

	// Round 1: the sink writes to the leader, which dies.
	ld, _ := s.killMirrorLeader(src, mst, 1000)
	src.pauseSink(t, true) // holds the rest of the drain for round 2
	restartAt := time.Now()
	ld.start()
	ld.waitServing()
	s.waitFullISR(mst.name, restartAt)

	// Round 2: the sink writes to a follower, which forwards to the
	// leader, which dies. The follower is not the node just restarted:
	// that one is first in the replica list here and takes the lead, so
	// the follower goes on forwarding, to the new leader.
	cur := s.leader(mst.name)
	var f *node
	for _, nd := range s.nodes {
		if nd != cur && nd != ld {
			f = nd
		}
	}
	door.moveTo(f)
	pos, _ := src.sinkPosition(t)
	src.pauseSink(t, false)
	t.Logf("round 2: the sink at %d, now through %s, a follower of %s", pos, f.id, cur.id)
	ld, killAt := s.killMirrorLeader(src, mst, pos+500)
	if now := s.leader(mst.name); now != f {
		t.Logf("round 2: %s, which the sink writes to, forwards to the new leader %s", f.id, now.id)
	}

	<-produced
	if prodErr != nil {
		t.Fatalf("source producer: %v", prodErr)
	}
	want := src.replay(t, streamSpec{"default", "#"}, mirrorRecords)
	testwait.EventuallyWithin(t, wait(3*time.Minute), fmt.Sprintf("the sink's position to reach the source's end %d", mirrorRecords), func() bool {
		pos, _ := src.sinkPosition(t)
		return pos == mirrorRecords
	})
	_, reconnects := src.sinkPosition(t)
	t.Logf("the sink reached the source's end %v after the second kill (%d reconnects; connections went to %v)",
		time.Since(killAt).Round(time.Millisecond), reconnects, door.used())
	for _, nd := range s.nodes {
		if nd != ld { // the two survivors
			checkMirror(t, nd, mst, want)
		}
	}
	restartAt = time.Now()
	ld.start()
	ld.waitServing()
	s.waitFullISR(mst.name, restartAt)
	checkMirror(t, ld, mst, want)
	t.Logf("%s restarted and caught up %v later; mirror results since the nodes' last start: %s",
		ld.id, time.Since(restartAt).Round(time.Millisecond), mirrorCounts(t, s.nodes))
}

// killMirrorLeader waits until the mirror's leader has committed
// atLeast records, kills it with kill -9 while the source's sink has
// records left to send, and waits for another leader; it returns the
// killed node and when it was killed.
func (s *site) killMirrorLeader(src *node, mst streamSpec, atLeast uint64) (*node, time.Time) {
	s.t.Helper()
	ld := s.leader(mst.name)
	testwait.EventuallyWithin(s.t, wait(30*time.Second), "GET /api/v1/cluster to name "+ld.id+" the leader of "+mst.name, func() bool {
		return s.nodes[0].clusterLeader(s.t, mst.name) == ld.id
	})
	epoch := ld.epoch(mst.name)
	testwait.EventuallyWithin(s.t, wait(2*time.Minute), fmt.Sprintf("the mirror's leader %s to commit %d records", ld.id, atLeast), func() bool {
		c, err := ld.committed(mst.name)
		return err == nil && c >= atLeast
	})
	killAt := time.Now()
	ld.kill()
	at, _ := src.sinkPosition(s.t)
	if at >= mirrorRecords {
		s.t.Fatalf("the sink had sent all %d records before %s's kill: the kill did not land mid-stream", mirrorRecords, ld.id)
	}
	next := s.leader(mst.name)
	if next == ld || next.epoch(mst.name) <= epoch {
		s.t.Fatalf("after %s (epoch %d) died, %s leads in epoch %d", ld.id, epoch, next.id, next.epoch(mst.name))
	}
	s.t.Logf("kill -9 %s (the mirror's leader, epoch %d) with the sink at %d of %d; %s leads in epoch %d %v later",
		ld.id, epoch, at, mirrorRecords, next.id, next.epoch(mst.name), time.Since(killAt).Round(time.Millisecond))
	return ld, killAt
}

// checkMirror waits until nd has committed the whole mirror, then reads
// it through $replay and asserts that each offset holds the source's
// record at that offset (topic under site-a/, same payload), and
// nothing past the source's end.
func checkMirror(t *testing.T, nd *node, mst streamSpec, want []replayed) {
	t.Helper()
	end := uint64(len(want))
	var info streamInfo
	testwait.EventuallyWithin(t, wait(2*time.Minute), fmt.Sprintf("%s to commit the mirror up to %d", nd.id, end), func() bool {
		info = streamInfo{}
		return getJSON(nd.http, "/api/v1/streams/"+mst.name, &info) == nil && info.Committed >= end
	})
	if info.Next != end || info.Committed != end {
		t.Fatalf("%s: the mirror ends at %d (committed %d), the source at %d: records past the source's end", nd.id, info.Next, info.Committed, end)
	}
	got := nd.replay(t, mst, end)
	for off, w := range want {
		if g := got[off]; g.topic != "site-a/"+w.topic || g.payload != w.payload {
			t.Fatalf("%s: mirror offset %d holds %s %q, the source %s %q", nd.id, off, g.topic, g.payload, w.topic, w.payload)
		}
	}
	t.Logf("%s: the mirror holds the source's %d records, each once at its source offset", nd.id, end)
}

// startSource starts a single Peat (no cluster) whose peat sink "hq"
// mirrors its default stream to url as site-a.default, topics under
// site-a/, at most mirrorRate records/s.
func startSource(t *testing.T, url string) *node {
	t.Helper()
	nd := &node{t: t, id: "source", dir: filepath.Join(t.TempDir(), "source")}
	nd.mqtt, nd.http = freeAddr(t), freeAddr(t)
	if err := os.MkdirAll(nd.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`data_dir: %s
log: {format: json}
http: {listen: %q}
mqtt: {listen: %q}
sinks:
  - name: hq
    streams: [default]
    max_rate: %d
    backoff: {min: 100ms, max: 1s}
    peat: {url: "mqtt://%s", client_id: site-a, mirror_as: "site-a.{stream}", topic: "site-a/{topic}"}
`, filepath.Join(nd.dir, "data"), nd.http, nd.mqtt, mirrorRate, url)
	nd.cfgPath = filepath.Join(nd.dir, "peat.yaml")
	if err := os.WriteFile(nd.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nd.kill()
		if t.Failed() {
			nd.dumpLog(40)
		}
	})
	nd.start()
	nd.waitServing()
	return nd
}

// publishN publishes n QoS 1 records to addr, one at a time, over topics
// sensors/0/t .. sensors/6/t, each payload unique, until stop closes.
func publishN(addr string, n int, stop <-chan struct{}) error {
	c, err := dial(addr, "mirror-producer", 5)
	if err != nil {
		return err
	}
	defer c.close()
	for i := range n {
		select {
		case <-stop:
			return fmt.Errorf("stopped after %d of %d records", i, n)
		default:
		}
		if err := c.publish(fmt.Sprintf("sensors/%d/t", i%7), fmt.Appendf(nil, "rec-%d", i), wait(ackWait)); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
	}
	return nil
}

// pauseSink pauses or resumes the source's sink hq
// (POST /api/v1/sinks/hq/pause or resume).
func (nd *node) pauseSink(t testing.TB, pause bool) {
	t.Helper()
	verb := "resume"
	if pause {
		verb = "pause"
	}
	resp, err := http.Post("http://"+nd.http+"/api/v1/sinks/hq/"+verb, "application/json", nil)
	if err != nil {
		t.Fatalf("%s: %v", nd.id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: POST /api/v1/sinks/hq/%s: %s", nd.id, verb, resp.Status)
	}
}

// sinkPosition is the position of the source's sink hq in its default
// stream, and how many times it reconnected (GET /api/v1/sinks/hq).
func (nd *node) sinkPosition(t testing.TB) (pos, reconnects uint64) {
	t.Helper()
	var st struct {
		Reconnects uint64 `json:"reconnects"`
		Streams    []struct {
			Stream    string `json:"stream"`
			Committed uint64 `json:"committed_offset"`
		} `json:"streams"`
	}
	if err := getJSON(nd.http, "/api/v1/sinks/hq", &st); err != nil {
		t.Fatalf("%s: %v", nd.id, err)
	}
	for _, s := range st.Streams {
		if s.Stream == "default" {
			return s.Committed, st.Reconnects
		}
	}
	t.Fatalf("%s: sink hq shows no stream default", nd.id)
	return 0, 0
}

// clusterLeader is the leader of stream as GET /api/v1/cluster on nd
// shows it.
func (nd *node) clusterLeader(t testing.TB, stream string) string {
	t.Helper()
	var st struct {
		Streams []struct {
			Name   string `json:"name"`
			Leader string `json:"leader"`
		} `json:"streams"`
	}
	if err := getJSON(nd.http, "/api/v1/cluster", &st); err != nil {
		t.Fatalf("%s: %v", nd.id, err)
	}
	for _, s := range st.Streams {
		if s.Name == stream {
			return s.Leader
		}
	}
	return ""
}

// mirrorCounts is peat_mirror_records_total of each node, by result.
func mirrorCounts(t *testing.T, nodes []*node) string {
	t.Helper()
	var out []string
	for _, nd := range nodes {
		resp, err := http.Get("http://" + nd.http + "/metrics")
		if err != nil {
			t.Fatalf("%s: %v", nd.id, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", nd.id, err)
		}
		var lines []string
		for l := range strings.Lines(string(body)) {
			if strings.HasPrefix(l, "peat_mirror_records_total{") {
				lines = append(lines, strings.TrimSpace(strings.TrimPrefix(l, "peat_mirror_records_total")))
			}
		}
		out = append(out, fmt.Sprintf("%s %v", nd.id, lines))
	}
	return strings.Join(out, "; ")
}

// frontDoor is the one address the source's sink has (a peat sink takes
// one URL): a TCP proxy over the site's MQTT addresses, as a load
// balancer in front of a site is. Each connection goes to the node that
// took the last one, or, when that one refuses, to the next that answers.
type frontDoor struct {
	ln    net.Listener
	nodes []*node
	wg    sync.WaitGroup
	mu    struct {
		sync.Mutex
		cur   int
		conns map[net.Conn]struct{}
		used  []string
	}
}

// newFrontDoor starts a frontDoor whose first connection goes to first.
func newFrontDoor(t *testing.T, s *site, first *node) *frontDoor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &frontDoor{ln: ln, nodes: s.nodes}
	d.mu.conns = map[net.Conn]struct{}{}
	for i, nd := range s.nodes {
		if nd == first {
			d.mu.cur = i
		}
	}
	d.wg.Add(1)
	go d.serve()
	t.Cleanup(func() {
		ln.Close()
		d.mu.Lock()
		for c := range d.mu.conns {
			c.Close()
		}
		d.mu.Unlock()
		d.wg.Wait()
	})
	return d
}

func (d *frontDoor) addr() string { return d.ln.Addr().String() }

// moveTo sends the next connections to nd and closes those open (a
// client reaching another node).
func (d *frontDoor) moveTo(nd *node) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, n := range d.nodes {
		if n == nd {
			d.mu.cur = i
		}
	}
	for c := range d.mu.conns {
		c.Close()
	}
}

// used is the node of each connection, in order.
func (d *frontDoor) used() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.mu.used...)
}

func (d *frontDoor) serve() {
	defer d.wg.Done()
	for {
		in, err := d.ln.Accept()
		if err != nil {
			return
		}
		out := d.dial()
		if out == nil {
			in.Close()
			continue
		}
		d.mu.Lock()
		d.mu.conns[in], d.mu.conns[out] = struct{}{}, struct{}{}
		d.mu.Unlock()
		d.wg.Add(2)
		go d.pipe(in, out)
		go d.pipe(out, in)
	}
}

// dial connects to the current node, or the next ones in turn.
func (d *frontDoor) dial() net.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	for range d.nodes {
		nd := d.nodes[d.mu.cur]
		if c, err := net.DialTimeout("tcp", nd.mqtt, 2*time.Second); err == nil {
			d.mu.used = append(d.mu.used, nd.id)
			return c
		}
		d.mu.cur = (d.mu.cur + 1) % len(d.nodes)
	}
	return nil
}

// pipe copies src to dst until either ends, then closes both: a node's
// death closes the sink's connection too.
func (d *frontDoor) pipe(dst, src net.Conn) {
	defer d.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	d.mu.Lock()
	delete(d.mu.conns, dst)
	delete(d.mu.conns, src)
	d.mu.Unlock()
}
