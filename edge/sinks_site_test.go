package edge

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/edge/sink"
	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/logstore"
)

// siteSinkWindow is the sinks' window in the site tests; siteResent,
// the window and a commit batch, bounds what a failover may send twice.
const siteSinkWindow = 16

var siteResent = sink.MaxResent(siteSinkWindow)

// startSite3 starts three voters, each with its config edited by edit,
// and waits until every configured stream has a full ISR.
func startSite3(t *testing.T, edit func(*Config)) []*Node {
	t.Helper()
	nodes, _ := startSite3Cfgs(t, edit)
	return nodes
}

// startSite3Cfgs is startSite3 that also returns each node's config.
func startSite3Cfgs(t *testing.T, edit func(*Config)) ([]*Node, []Config) {
	t.Helper()
	c1 := siteConfig(t, "n1", 3)
	edit(&c1)
	first := startNode(t, c1)
	nodes, cfgs := []*Node{first}, []Config{c1}
	for _, id := range []string{"n2", "n3"} {
		c := siteConfig(t, id, 3, first.site.Load().Node.SerfAddr())
		edit(&c)
		nodes, cfgs = append(nodes, startNode(t, c)), append(cfgs, c)
	}
	names := []string{logstore.DefaultStreamName}
	for _, sc := range c1.Streams {
		names = append(names, sc.Name)
	}
	eventually(t, "every stream with a full ISR, served on every node", func() bool {
		for _, n := range nodes {
			site := n.site.Load()
			st, _ := site.Node.State()
			for _, name := range names {
				if s := st.Streams[name]; s == nil || len(s.ISR) != 3 || s.Leader == "" || site.Log.Stream(name) == nil {
					return false
				}
			}
		}
		return true
	})
	return nodes, cfgs
}

// startSinkSite starts three voters that each carry the same MQTT sink
// of every stream to upstream (topic site-a/<node>/<topic>, so the
// upstream sees which node sent a record), and waits for a full ISR.
func startSinkSite(t *testing.T, upstream string, maxRate float64, edit func(*Config)) []*Node {
	t.Helper()
	nodes, _ := startSinkSiteCfgs(t, upstream, maxRate, edit)
	return nodes
}

func startSinkSiteCfgs(t *testing.T, upstream string, maxRate float64, edit func(*Config)) ([]*Node, []Config) {
	t.Helper()
	return startSite3Cfgs(t, func(c *Config) {
		edit(c)
		c.Sinks = sinkConfig(t, upstream).Sinks
		c.Sinks[0].MQTT.Topic = "site-a/{node}/{topic}"
		c.Sinks[0].MQTT.Window = siteSinkWindow
		c.Sinks[0].MaxRate = maxRate
		c.Sinks[0].StallAfter = Duration(2 * time.Second) // a standby stream must never show it
	})
}

// leaderOf is the node leading stream as nodes[0] knows it.
func leaderOf(t *testing.T, nodes []*Node, stream string) *Node {
	t.Helper()
	st, _ := nodes[0].site.Load().Node.State()
	for _, n := range nodes {
		if s := st.Streams[stream]; s != nil && s.Leader == n.cfg.Cluster.NodeID {
			return n
		}
	}
	t.Fatalf("no node of %d leads %s", len(nodes), stream)
	return nil
}

// waitNewLeader waits until the survivors agree that stream has a leader
// other than old, and returns it.
func waitNewLeader(t *testing.T, survivors []*Node, stream, old string) *Node {
	t.Helper()
	eventually(t, "a new leader of "+stream, func() bool {
		st, _ := survivors[0].site.Load().Node.State()
		l := st.Streams[stream].Leader
		return l != "" && l != old
	})
	return leaderOf(t, survivors, stream)
}

// crashNode stops n as a crash would: its sources and sinks end where
// they are (a source's messages not yet durable unacknowledged; a sink's
// position as last committed, what was acknowledged since not), and its
// cluster node goes without handing anything over, so the others find it
// failed; the rest of it closes afterwards.
func crashNode(t *testing.T, n *Node) {
	t.Helper()
	n.stopSources()
	n.stopSinks()
	if err := n.site.Load().Node.Close(); err != nil {
		t.Logf("crash %s: %v", n.cfg.Cluster.NodeID, err)
	}
	closeNode(t, n)
}

// sinkStream is the status of the default stream in the node's only
// sink.
func sinkStream(t *testing.T, n *Node) sink.StreamStatus {
	t.Helper()
	st := sinkStatuses(t, n)
	if len(st) != 1 || len(st[0].Streams) != 1 {
		t.Fatalf("%s: sinks %+v, want one with one stream", n.cfg.Cluster.NodeID, st)
	}
	return st[0].Streams[0]
}

// publisher sends QoS 1 messages p0, p1, ... from one client and
// remembers which were acknowledged; a failed publish is not retried, so
// every payload is in the log at most once.
type publisher struct {
	n     *Node
	id    string
	mu    sync.Mutex
	next  int
	acked []string
}

// send publishes k messages on a new connection and waits for their
// PUBACKs; those refused (the stream's leader died under them: an MQTT
// 3.1.1 client is disconnected) are left out of acked.
func (p *publisher) send(t *testing.T, k int, wait time.Duration) {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + p.n.MQTTAddr().String()).
		SetClientID(p.id).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect to %s: %v", p.n.cfg.Cluster.NodeID, tok.Error())
	}
	defer c.Disconnect(0)
	type sent struct {
		payload string
		tok     paho.Token
	}
	var toks []sent
	for range k {
		p.mu.Lock()
		payload := "p" + strconv.Itoa(p.next)
		p.next++
		p.mu.Unlock()
		toks = append(toks, sent{payload, c.Publish("sensors/t", 1, false, payload)})
	}
	for _, s := range toks {
		if s.tok.WaitTimeout(wait) && s.tok.Error() == nil {
			p.mu.Lock()
			p.acked = append(p.acked, s.payload)
			p.mu.Unlock()
		}
	}
}

// TestCluster_SinkFollowsTheStreamLeader: a site's sink sends each
// stream from its leader only. The leader is killed while the sink
// drains a backlog, publishing goes on through the survivors, and the
// new leader's sink continues from the position the site replicated:
// upstream gets every committed record (every acknowledged one among
// them) in offset order, records sent again only as a rewind of at most
// the window and a commit batch, and only by the two leaders around the
// failover. Once
// leadership settles one node's sink is connected for the stream, and
// the other shows it on standby, led by that node, never stalled.
func TestCluster_SinkFollowsTheStreamLeader(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site-a/#")
	nodes := startSinkSite(t, upstream, 200, func(*Config) {}) // 200 records/s: the kill lands mid-drain
	leader, others := streamLeader(t, nodes)
	old := leader.cfg.Cluster.NodeID

	eventually(t, "the followers' sinks on standby, naming the leader", func() bool {
		for _, n := range others {
			if ss := sinkStream(t, n); ss.State != sink.StateStandby || ss.Leader != old {
				return false
			}
		}
		return sinkStream(t, leader).State == sink.StateConnected
	})
	for _, n := range others {
		series := `peat_sink_state{sink="cloud",state="standby",stream="default"}`
		eventually(t, n.cfg.Cluster.NodeID+" "+series+" 1", func() bool { return metricValue(t, n, series) == 1 })
	}

	pub := &publisher{n: others[0], id: "pub"}
	pub.send(t, 600, time.Minute)
	eventually(t, "the leader's sink part way through the backlog", func() bool { return len(col.Payloads()) >= 100 })
	crashNode(t, leader)
	if len(col.Payloads()) >= 600 {
		t.Fatal("the sink drained everything before the kill: the test did not kill mid-drain")
	}
	pub.send(t, 100, 5*time.Second) // refused until the new leader takes over; those are left out
	waitNewLeader(t, others, logstore.DefaultStreamName, old)
	pub.send(t, 100, time.Minute)
	next, standby := streamLeader(t, others)
	log := next.Store().Stream(logstore.DefaultStreamName)
	eventually(t, "the survivors to commit what they hold", func() bool {
		return log.Committed() == log.NextOffset() && log.Committed() >= uint64(len(pub.acked))
	})
	end := log.Committed()
	recs, err := log.Read(0, int(end), 64<<20)
	if err != nil || uint64(len(recs)) != end {
		t.Fatalf("read the site's log: %d records, %v", len(recs), err)
	}
	offsetOf := map[string]int{}
	for _, r := range recs {
		if _, dup := offsetOf[string(r.Payload)]; dup {
			t.Fatalf("payload %s twice in the log", r.Payload)
		}
		offsetOf[string(r.Payload)] = int(r.Offset)
	}
	for _, p := range pub.acked {
		if _, ok := offsetOf[p]; !ok {
			t.Fatalf("acknowledged %s is not in the new leader's log", p)
		}
	}

	// Everything committed arrives, in order, with rewinds of at most the
	// window, sent by the old leader and the new one only.
	upstreamOffsets := func() (offs []string, by map[int]map[string]bool) {
		by = map[int]map[string]bool{}
		payloads := col.Payloads()
		topics := col.Topics() // after: as long at least (more may have arrived)
		for i, p := range payloads {
			off, ok := offsetOf[p]
			if !ok {
				t.Fatalf("upstream got %q, which the site's log does not hold", p)
			}
			node := strings.Split(topics[i], "/")[1]
			if by[off] == nil {
				by[off] = map[string]bool{}
			}
			by[off][node] = true
			offs = append(offs, strconv.Itoa(off))
		}
		return offs, by
	}
	eventually(t, fmt.Sprintf("all %d committed records upstream", end), func() bool {
		offs, _ := upstreamOffsets()
		seen := map[string]bool{}
		for _, o := range offs {
			seen[o] = true
		}
		return len(seen) == int(end)
	})
	offs, by := upstreamOffsets()
	dups := sinktest.CheckInOrder(t, offs, int(end), siteResent)
	twice := 0
	for off, senders := range by {
		for node := range senders {
			if node != old && node != next.cfg.Cluster.NodeID {
				t.Fatalf("offset %d sent by %s, which never led the stream", off, node)
			}
		}
		if len(senders) > 1 {
			twice++
		}
	}
	if twice > siteResent {
		t.Fatalf("%d records sent by both leaders, more than the window and a commit batch, %d", twice, siteResent)
	}
	t.Logf("%d records upstream for %d committed (%d acknowledged): %d repeats, %d sent by both leaders",
		len(offs), end, len(pub.acked), dups, twice)

	// Leadership settled: the new leader's sink is connected and caught up,
	// the other survivor's on standby naming it, never stalled.
	eventually(t, "the new leader's sink caught up", func() bool {
		ss := sinkStream(t, next)
		return ss.State == sink.StateConnected && ss.CommittedOffset == end
	})
	deadline := time.Now().Add(3 * time.Second) // over stall_after: a standby stream is never stalled
	for time.Now().Before(deadline) {
		ss := sinkStream(t, standby[0])
		if ss.State != sink.StateStandby || ss.Leader != next.cfg.Cluster.NodeID || ss.LagRecords != 0 {
			t.Fatalf("%s shows the stream %+v, want standby, led by %s", standby[0].cfg.Cluster.NodeID, ss, next.cfg.Cluster.NodeID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ss := sinkStream(t, standby[0]); ss.CommittedOffset != end {
		t.Errorf("%s shows the position %d, want %d: the one the site replicated", standby[0].cfg.Cluster.NodeID, ss.CommittedOffset, end)
	}
}

// TestCluster_SinkSendsOnlyCommittedRecords: records the stream's leader
// has written (and, acks=leader, acknowledged) but the site has not
// committed (its followers are gone, so its ISR is below
// min_insync_replicas) are not sent upstream: they may still be
// truncated by a new leader and replaced by others at the same offsets.
func TestCluster_SinkSendsOnlyCommittedRecords(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site-a/#")
	// acks=leader: the leader takes and acknowledges publishes while its
	// ISR is below min_insync_replicas, and commits none of them.
	nodes := startSinkSite(t, upstream, 0, func(c *Config) { c.Cluster.Acks = AcksLeader })
	leader, others := streamLeader(t, nodes)
	publishQoS1(t, leader.MQTTAddr(), "sensors/a", 20)
	sinktest.WaitFor(t, "20 records upstream", time.Minute, func() bool { return len(col.Payloads()) >= 20 })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range others {
		if err := n.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	log := leader.Store().Stream(logstore.DefaultStreamName)
	committed := log.Committed()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + leader.MQTTAddr().String()).
		SetClientID("uncommitted").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	for i := range 10 {
		c.Publish("sensors/b", 1, false, fmt.Sprintf("b%d", i))
	}
	eventually(t, "10 records written on the leader, not committed", func() bool { return log.NextOffset() >= committed+10 })
	if got := log.Committed(); got != committed {
		t.Fatalf("the leader committed %d records alone; the test needs them uncommitted", got-committed)
	}
	eventually(t, "the sink caught up with the committed records", func() bool {
		return sinkStream(t, leader).CommittedOffset == committed
	})
	time.Sleep(time.Second) // a record sent past the watermark would arrive meanwhile
	for _, p := range col.Payloads() {
		if strings.HasPrefix(p, "b") {
			t.Fatalf("upstream got %s, which the site never committed", p)
		}
	}
	if got := len(col.Payloads()); uint64(got) != committed {
		t.Fatalf("upstream got %d records, want the %d committed", got, committed)
	}
}

// sentBy counts what the upstream got from each node (topic
// site-a/<node>/...).
func sentBy(col *sinktest.Collector) map[string]int {
	out := map[string]int{}
	for _, topic := range col.Topics() {
		out[strings.Split(topic, "/")[1]]++
	}
	return out
}

// distinct is how many different records (original topic and payload)
// the upstream got, whichever node sent them.
func distinct(col *sinktest.Collector) int {
	payloads := col.Payloads()
	topics := col.Topics() // after: as long at least
	seen := map[string]bool{}
	for i, p := range payloads {
		_, rest, _ := strings.Cut(strings.TrimPrefix(topics[i], "site-a/"), "/")
		seen[rest+" "+p] = true
	}
	return len(seen)
}

// TestCluster_SinkAcrossAControlledShutdownAndReturn: the leader stops
// gracefully and its stream's new leader goes on from the replicated
// position; when the old leader returns (same data, a follower now) its
// sink stays on standby, naming the leader, and sends nothing from the
// position its own store had when it stopped.
func TestCluster_SinkAcrossAControlledShutdownAndReturn(t *testing.T) {
	upstream := sinktest.StartMosquitto(t)
	col := sinktest.NewCollector(t, upstream, "site-a/#")
	nodes, cfgs := startSinkSiteCfgs(t, upstream, 0, func(*Config) {})
	leader, others := streamLeader(t, nodes)
	old := leader.cfg.Cluster.NodeID
	publishQoS1(t, others[0].MQTTAddr(), "sensors/a", 50)
	eventually(t, "50 records upstream", func() bool { return distinct(col) == 50 })

	site := leader.site.Load()
	serfAddr, raftAddr, transport := site.Node.SerfAddr(), site.Node.RaftAddr(), site.Server.Addr()
	closeNode(t, leader)
	next := waitNewLeader(t, others, logstore.DefaultStreamName, old)
	publishQoS1(t, next.MQTTAddr(), "sensors/b", 50)
	eventually(t, "100 records upstream", func() bool { return distinct(col) == 100 })
	fromOld := sentBy(col)[old]

	var cfg Config
	for _, c := range cfgs {
		if c.Cluster.NodeID == old {
			cfg = c
		}
	}
	// Back at its own addresses (Serf refuses a failed member's name from
	// another address).
	cfg.Cluster.Listen, cfg.Cluster.RaftListen, cfg.Cluster.TransportListen = serfAddr, raftAddr, transport
	cfg.Cluster.Join = []string{next.site.Load().Node.SerfAddr()}
	back := startNode(t, cfg)
	eventually(t, old+" back in the ISR", func() bool {
		st, _ := next.site.Load().Node.State()
		s := st.Streams[logstore.DefaultStreamName]
		return len(s.ISR) == 3 && s.Leader == next.cfg.Cluster.NodeID
	})
	eventually(t, old+"'s sink on standby, naming the leader", func() bool {
		ss := sinkStream(t, back)
		return ss.State == sink.StateStandby && ss.Leader == next.cfg.Cluster.NodeID
	})
	publishQoS1(t, back.MQTTAddr(), "sensors/c", 20)
	eventually(t, "120 records upstream", func() bool { return distinct(col) == 120 })
	if got := sentBy(col)[old]; got != fromOld {
		t.Fatalf("%s sent %d records after it returned as a follower", old, got-fromOld)
	}
	if got := len(col.Payloads()); got > 120+siteResent {
		t.Fatalf("upstream got %d messages for 120 records: more than a window and a commit batch twice", got)
	}
	if ss := sinkStream(t, back); ss.CommittedOffset < 100 {
		t.Errorf("%s shows the position %d, want at least 100: the one the site replicated, not its own old one", old, ss.CommittedOffset)
	}
}
