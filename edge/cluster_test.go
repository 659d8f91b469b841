package edge

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt/mqtttest/testwait"
)

// siteConfig is node id of a site on loopback, joining join.
func siteConfig(tb testing.TB, id string, expect int, join ...string) Config {
	cfg := testConfig(tb)
	cfg.Cluster.Name = "test-site"
	cfg.Cluster.NodeID = id
	cfg.Cluster.Listen = "127.0.0.1:0"
	cfg.Cluster.Expect = expect
	cfg.Cluster.Join = join
	return cfg
}

// eventually waits for a site of in-process nodes to reach a state
// (testwait.SiteLimit says why longer than other waits).
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	testwait.EventuallyWithin(tb, testwait.SiteLimit, what, cond)
}

// startSiteNodes starts a site of n voters and waits until the default
// stream exists with every node in its ISR.
func startSiteNodes(t *testing.T, n int) []*Node {
	t.Helper()
	first := startNode(t, siteConfig(t, "n1", n))
	nodes := []*Node{first}
	seed := first.site.Load().Node.SerfAddr()
	for i := 2; i <= n; i++ {
		nodes = append(nodes, startNode(t, siteConfig(t, "n"+string(rune('0'+i)), n, seed)))
	}
	// Every node serves it: one still forming refuses publishes.
	eventually(t, "the default stream with a full ISR, served on every node", func() bool {
		for _, node := range nodes {
			site := node.site.Load()
			st, _ := site.Node.State()
			s := st.Streams[logstore.DefaultStreamName]
			if s == nil || len(s.ISR) != n || s.Leader == "" || site.Log.Stream(logstore.DefaultStreamName) == nil {
				return false
			}
		}
		return true
	})
	return nodes
}

func streamLeader(t *testing.T, nodes []*Node) (leader *Node, others []*Node) {
	t.Helper()
	st, _ := nodes[0].site.Load().Node.State()
	id := st.Streams[logstore.DefaultStreamName].Leader
	for _, n := range nodes {
		if n.cfg.Cluster.NodeID == id {
			leader = n
		} else {
			others = append(others, n)
		}
	}
	if leader == nil {
		t.Fatalf("no node leads the default stream (leader %q)", id)
	}
	return leader, others
}

// A site configured in YAML's terms forms, creates its configured stream
// on three replicas, and QoS 1 publishes acknowledged by any node (the
// followers forward them to the leader) are on every replica, in the
// order each client sent them.
func TestCluster_SiteReplicatesPublishes(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	leader, _ := streamLeader(t, nodes)
	st, _ := leader.site.Load().Node.State()
	if got := st.Streams[logstore.DefaultStreamName].Replicas; len(got) != 3 {
		t.Fatalf("replicas %v, want 3 (the default factor: the voters, up to 3)", got)
	}
	for _, n := range nodes {
		publishQoS1(t, n.MQTTAddr(), "sensors/"+n.cfg.Cluster.NodeID, 20)
	}
	var first []string
	for _, n := range nodes {
		s := n.Store().Stream(logstore.DefaultStreamName)
		eventually(t, n.cfg.Cluster.NodeID+" to hold 60 committed records", func() bool { return s.Committed() >= 60 })
		recs, err := s.Read(0, 100, 1<<20)
		if err != nil || len(recs) != 60 {
			t.Fatalf("%s: read %d records, err %v", n.cfg.Cluster.NodeID, len(recs), err)
		}
		var got []string
		next := map[string]int{}
		for _, r := range recs {
			if want := fmt.Sprintf("m%d", next[r.Topic]); string(r.Payload) != want {
				t.Fatalf("%s: offset %d on %s holds %q, want %q (each client's order)", n.cfg.Cluster.NodeID, r.Offset, r.Topic, r.Payload, want)
			}
			next[r.Topic]++
			got = append(got, r.Topic+"/"+string(r.Payload))
		}
		if first == nil {
			first = got
		} else if !slices.Equal(first, got) {
			t.Fatalf("%s holds another order than %s", n.cfg.Cluster.NodeID, nodes[0].cfg.Cluster.NodeID)
		}
	}
}

func TestClusterConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"listen without node id", func(c *Config) { c.Cluster.NodeID = "" }, "cluster.node_id"},
		{"host name", func(c *Config) { c.Cluster.Listen = "localhost:7946" }, "cluster.listen"},
		{"unspecified", func(c *Config) { c.Cluster.Listen = "0.0.0.0:7946" }, "cluster.listen"},
		{"even expect", func(c *Config) { c.Cluster.Expect = 2 }, "cluster.expect"},
		{"broker bootstraps", func(c *Config) { c.Cluster.Voter = false }, "cluster.expect"},
		{"min isr above factor", func(c *Config) { c.Cluster.ReplicationFactor, c.Cluster.MinInsyncReplicas = 2, 3 }, "cluster.min_insync_replicas"},
		{"clear text on the LAN", func(c *Config) { c.Cluster.Listen = "192.168.1.10:7946" }, "cluster.keyring_file"},
		{"half of tls", func(c *Config) { c.Cluster.TLS.CertFile = "x.pem" }, "cluster.tls"},
		{"same port twice", func(c *Config) { c.Cluster.RaftListen = "127.0.0.1:7946"; c.Cluster.Listen = "127.0.0.1:7946" }, "cluster.raft_listen"},
		{"stream min isr above its factor", func(c *Config) { c.Streams[0].ReplicationFactor, c.Streams[0].MinInsyncReplicas = 1, 2 }, "streams[0].min_insync_replicas"},
		{"replace_after a reboot would reach", func(c *Config) { c.Cluster.ReplaceAfter = Duration(time.Minute) }, "cluster.replace_after"},
		{"negative replace_after", func(c *Config) { c.Cluster.ReplaceAfter = Duration(-time.Hour) }, "cluster.replace_after"},
		{"the sessions' stream's name", func(c *Config) { c.Streams[0].Name = cluster.SessionsStream }, "streams[0].name"},
		{"leader_balance_after too short", func(c *Config) { c.Cluster.LeaderBalanceAfter = Duration(time.Second) }, "cluster.leader_balance_after"},
		{"negative leader_balance_after", func(c *Config) { c.Cluster.LeaderBalanceAfter = Duration(-time.Minute) }, "cluster.leader_balance_after"},
		{"session_timeout shorter than three heartbeats", func(c *Config) { c.Cluster.SessionTimeout = Duration(time.Second) }, "cluster.session_timeout"},
		{"no reconnect_interval", func(c *Config) { c.Cluster.ReconnectInterval = 0 }, "cluster.reconnect_interval"},
		{"mirror with acks: leader", func(c *Config) { c.Streams[0].Mirror, c.Streams[0].Acks = true, AcksLeader }, "streams[0].acks: a mirror stream needs acks: all"},
		{"mirror under cluster.acks: leader", func(c *Config) { c.Streams[0].Mirror, c.Cluster.Acks = true, AcksLeader }, "streams[0].acks: a mirror stream needs acks: all"},
		{"mirror with unclean election", func(c *Config) { c.Streams[0].Mirror, c.Streams[0].UncleanLeaderElection = true, true }, "streams[0].unclean_leader_election"},
		{"stream settings on one node", func(c *Config) { c.Cluster.NodeID, c.Cluster.Listen = "", ""; c.Streams[0].ReplicationFactor = 2 }, "streams[0].replication_factor: replication settings need a cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := siteConfig(t, "n1", 1)
			tc.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
	cfg := siteConfig(t, "n1", 3)
	cfg.Cluster.Listen = "192.168.1.10:7946"
	cfg.Cluster.AllowPlaintext = true
	cfg.Cluster.ReplaceAfter = Duration(24 * time.Hour)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a valid site config: %v", err)
	}
	mirrored := cfg
	mirrored.Streams = append(slices.Clone(cfg.Streams), StreamConfig{Name: "site-a.default", Mirror: true, Filters: []string{"site-a/#"}})
	if err := mirrored.Validate(); err != nil {
		t.Fatalf("a site with a mirror stream: %v", err)
	}
	cfg.Sinks = sinkConfig(t, "127.0.0.1:1883").Sinks
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a site with a sink (run on each stream's leader): %v", err)
	}
	sc := cfg.SiteConfig()
	if sc.Node.ReplaceAfter != 24*time.Hour {
		t.Fatalf("replace_after reaches the node as %v", sc.Node.ReplaceAfter)
	}
	if sc.LeaderBalanceAfter != 5*time.Minute {
		t.Fatalf("leader_balance_after reaches the site as %v, want the 5m default", sc.LeaderBalanceAfter)
	}
	if sc.Node.SessionTimeout != cluster.DefaultSessionTimeout || sc.Node.ReconnectInterval != cluster.DefaultReconnectInterval {
		t.Fatalf("session_timeout %v and reconnect_interval %v reach the node, want the defaults", sc.Node.SessionTimeout, sc.Node.ReconnectInterval)
	}
	if sc.Node.RaftAddr != "192.168.1.10:7947" || sc.TransportListen != "192.168.1.10:7948" {
		t.Fatalf("derived addresses raft %s transport %s, want the next two ports", sc.Node.RaftAddr, sc.TransportListen)
	}
	if !cfg.StoreConfig().ManualCommit {
		t.Fatal("a site's store must commit when the ISR holds a record (ManualCommit)")
	}
	if !slices.Equal(sc.Streams, []cluster.SiteStream{{Name: logstore.DefaultStreamName}}) {
		t.Fatalf("site streams %v, want the configured ones", sc.Streams)
	}
}

// A node whose site has not formed yet (it waits for two more voters)
// refuses publishes its configured streams capture instead of passing
// them through unstored.
func TestCluster_FormingSiteRefusesPublishes(t *testing.T) {
	n := startNode(t, siteConfig(t, "n1", 3))
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID("early").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	tok := c.Publish("sensors/t", 1, false, "x")
	if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
		t.Fatal("a publish was acknowledged before the site had its stream")
	}
	if got := n.Store().Stream(logstore.DefaultStreamName).Committed(); got != 0 {
		t.Fatalf("%d records committed", got)
	}
}

// A node stopped gracefully hands its streams over at once: with failure
// detection slowed to about a minute, the stream still has a new leader,
// and takes publishes, within seconds of the old leader's Close.
func TestCluster_GracefulStopHandsOver(t *testing.T) {
	slow := func(c *Config) {
		c.Cluster.ProbeInterval = Duration(5 * time.Second)
		c.Cluster.ProbeTimeout = Duration(2 * time.Second)
		c.Cluster.SuspicionMult = 10
	}
	cfgs := []Config{siteConfig(t, "n1", 3)}
	slow(&cfgs[0])
	first := startNode(t, cfgs[0])
	nodes := []*Node{first}
	for _, id := range []string{"n2", "n3"} {
		c := siteConfig(t, id, 3, first.site.Load().Node.SerfAddr())
		slow(&c)
		nodes = append(nodes, startNode(t, c))
	}
	eventually(t, "a full ISR", func() bool {
		st, _ := first.site.Load().Node.State()
		s := st.Streams[logstore.DefaultStreamName]
		return s != nil && len(s.ISR) == 3
	})
	leader, others := streamLeader(t, nodes)
	old := leader.cfg.Cluster.NodeID
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := leader.Close(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second) // Serf alone would take about a minute
	for {
		st, _ := others[0].site.Load().Node.State()
		if s := st.Streams[logstore.DefaultStreamName]; s.Leader != "" && s.Leader != old && !slices.Contains(s.ISR, old) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader 15 s after %s stopped: %+v", old, st.Streams[logstore.DefaultStreamName])
		}
		time.Sleep(50 * time.Millisecond)
	}
	next, _ := streamLeader(t, others)
	publishQoS1(t, next.MQTTAddr(), "sensors/t", 5)
}

// A stream's own replication settings win over the site's: two replicas,
// both needed for an acknowledgement, so with one of them stopped the
// stream refuses publishes while the site's default stream takes them.
func TestCluster_StreamReplicationSettings(t *testing.T) {
	withStreams := func(c *Config) {
		two := defaultStream("two", "two/#")
		two.ReplicationFactor, two.MinInsyncReplicas = 2, 2
		fast := defaultStream("fast", "fast/#")
		fast.MinInsyncReplicas, fast.Acks = 3, AcksLeader
		c.Streams = []StreamConfig{two, fast, defaultStream(logstore.DefaultStreamName, "#")}
	}
	c1 := siteConfig(t, "n1", 3)
	withStreams(&c1)
	first := startNode(t, c1)
	nodes := []*Node{first}
	for _, id := range []string{"n2", "n3"} {
		c := siteConfig(t, id, 3, first.site.Load().Node.SerfAddr())
		withStreams(&c)
		nodes = append(nodes, startNode(t, c))
	}
	var two *rules.Stream
	eventually(t, "both streams with full ISRs", func() bool {
		st, _ := first.site.Load().Node.State()
		d, tw := st.Streams[logstore.DefaultStreamName], st.Streams["two"]
		if d == nil || tw == nil || len(d.ISR) != 3 || len(tw.ISR) != len(tw.Replicas) {
			return false
		}
		two = tw
		return true
	})
	if len(two.Replicas) != 2 {
		t.Fatalf("stream two has replicas %v, want 2", two.Replicas)
	}
	byID := map[string]*Node{}
	for _, n := range nodes {
		byID[n.cfg.Cluster.NodeID] = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := byID[two.Replicas[1]].Close(ctx); err != nil {
		t.Fatal(err)
	}
	lead := byID[two.Replicas[0]]
	eventually(t, "the ISR of two to shrink", func() bool {
		st, _ := lead.site.Load().Node.State()
		return len(st.Streams["two"].ISR) == 1 && st.Streams["two"].Leader == lead.cfg.Cluster.NodeID
	})
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + lead.MQTTAddr().String()).
		SetClientID("two-pub").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	if tok := c.Publish("two/x", 1, false, "x"); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
		t.Fatal("stream two acknowledged a publish with 1 in-sync replica; its min_insync_replicas is 2")
	}
	// The default stream (3 replicas, minimum 2) still takes publishes,
	// and so does fast, acks=leader, though its ISR is below its minimum.
	publishQoS1(t, lead.MQTTAddr(), "other/x", 3)
	eventually(t, "the ISR of fast to shrink", func() bool {
		st, _ := lead.site.Load().Node.State()
		return len(st.Streams["fast"].ISR) == 2
	})
	publishQoS1(t, lead.MQTTAddr(), "fast/x", 3)
}

// A node that holds no replica of a stream observes it: its subscribers
// read the stream there and its publishers' records reach the replicas.
func TestCluster_ObserverServesItsClients(t *testing.T) {
	withStreams := func(c *Config) {
		one := defaultStream("one", "one/#")
		one.ReplicationFactor = 1
		c.Streams = []StreamConfig{one, defaultStream(logstore.DefaultStreamName, "#")}
	}
	c1 := siteConfig(t, "n1", 3)
	withStreams(&c1)
	first := startNode(t, c1)
	nodes := []*Node{first}
	for _, id := range []string{"n2", "n3"} {
		c := siteConfig(t, id, 3, first.site.Load().Node.SerfAddr())
		withStreams(&c)
		nodes = append(nodes, startNode(t, c))
	}
	var replica string
	eventually(t, "stream one", func() bool {
		st, _ := first.site.Load().Node.State()
		if s := st.Streams["one"]; s != nil && s.Leader != "" {
			replica = s.Leader
			return true
		}
		return false
	})
	var obs *Node
	for _, n := range nodes {
		if n.cfg.Cluster.NodeID != replica {
			obs = n
			break
		}
	}
	eventually(t, "the observer to know both streams", func() bool {
		st, _ := obs.site.Load().Node.State()
		return st.Streams["one"] != nil && st.Streams[logstore.DefaultStreamName] != nil
	})
	publishQoS1(t, obs.MQTTAddr(), "one/x", 10)
	got := make(chan string, 10)
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + obs.MQTTAddr().String()).
		SetClientID("obs-sub").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	tok := c.Subscribe("$replay/earliest/+/one/#", 1, func(_ paho.Client, m paho.Message) { got <- string(m.Payload()) })
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe on the observer: %v", tok.Error())
	}
	for i := range 10 {
		select {
		case p := <-got:
			if want := fmt.Sprintf("m%d", i); p != want {
				t.Fatalf("record %d on the observer: %q, want %q", i, p, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the observer %s delivered %d of 10 records of a stream only %s holds", obs.cfg.Cluster.NodeID, i, replica)
		}
	}
	for _, n := range nodes {
		if n.cfg.Cluster.NodeID == replica {
			if got := n.Store().Stream("one").Committed(); got != 10 {
				t.Fatalf("stream one on its replica %s holds %d records, want 10", replica, got)
			}
		}
	}
}
