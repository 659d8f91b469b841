package edge

import (
	"context"
	"net"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
)

// killNode stops n as kill -9 would, as far as the site can tell: its
// cluster node goes first (the others find it failed, nothing handed
// over), then its Log, so nothing its broker writes as its clients'
// connections end reaches the site (a session connected at the crash
// stays stored as connected); the rest closes afterwards.
func killNode(t *testing.T, n *Node) {
	t.Helper()
	site := n.site.Load()
	if err := site.Node.Close(); err != nil {
		t.Logf("kill %s: %v", n.cfg.Cluster.NodeID, err)
	}
	if err := site.Log.Close(); err != nil {
		t.Logf("kill %s: %v", n.cfg.Cluster.NodeID, err)
	}
	closeNode(t, n)
}

// sessionStored reports whether n's copy of the site's sessions holds
// client id's session (mqtt keeps it under "s/<client id>").
func sessionStored(t *testing.T, n *Node, id string) bool {
	t.Helper()
	key := "s/" + id
	found := false
	err := n.site.Load().Log.SessionState().LoadState(key, func(k string, _ []byte) error {
		found = found || k == key
		return nil
	})
	if err != nil {
		t.Fatalf("read the sessions on %s: %v", n.cfg.Cluster.NodeID, err)
	}
	return found
}

// v5Client connects an MQTT 5 client with Clean Start 0 and Session
// Expiry Interval expiry to n and leaves it connected (closed at
// cleanup); got, when not nil, receives "topic payload" of every
// message delivered. A connection the site refuses (its sessions'
// leader failing over) is tried again.
func v5Client(t *testing.T, n *Node, id string, expiry uint32, got chan<- string) (c *pahov5.Client, present bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		conn, err := net.Dial("tcp", n.MQTTAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c := pahov5.NewClient(pahov5.ClientConfig{Conn: conn,
			OnPublishReceived: []func(pahov5.PublishReceived) (bool, error){func(p pahov5.PublishReceived) (bool, error) {
				if got != nil {
					got <- p.Packet.Topic + " " + string(p.Packet.Payload)
				}
				return true, nil
			}},
		})
		ca, err := c.Connect(ctx, &pahov5.Connect{ClientID: id, CleanStart: false, KeepAlive: 30,
			Properties: &pahov5.ConnectProperties{SessionExpiryInterval: &expiry}})
		if err != nil {
			conn.Close()
			if ctx.Err() != nil {
				t.Fatalf("connect %s: %v", id, err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		t.Cleanup(func() { _ = c.Disconnect(&pahov5.Disconnect{}) })
		return c, ca.SessionPresent
	}
}

// v5Subscribe subscribes c to filter at QoS 1.
func v5Subscribe(t *testing.T, c *pahov5.Client, filter string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Subscribe(ctx, &pahov5.Subscribe{Subscriptions: []pahov5.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
}

// waitSessionGone waits until every node of nodes has lost client id's
// session, with no client connecting meanwhile.
func waitSessionGone(t *testing.T, nodes []*Node, id string) {
	t.Helper()
	for _, n := range nodes {
		eventually(t, id+"'s session gone from "+n.cfg.Cluster.NodeID, func() bool { return !sessionStored(t, n, id) })
	}
}

// A v5 session whose node crashed while its client was connected expires
// its Session Expiry Interval after the site saw the node go, with no
// client connecting: it is deleted site-wide, and the client back on
// another node finds no session. The node that crashes leads the
// sessions' stream, so the one to expire it is its successor.
func TestCluster_OrphanedSessionExpires(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	home, others := sessionsLeader(t, nodes)
	c, present := v5Client(t, home, "orphan", 3, nil)
	if present {
		t.Fatal("a new client's session is present")
	}
	v5Subscribe(t, c, "sensors/#")
	if !sessionStored(t, others[0], "orphan") {
		t.Fatal("the session is not stored on the other nodes")
	}
	killNode(t, home)
	waitSessionGone(t, others, "orphan")
	var adopted, expired float64
	for _, n := range others {
		adopted += metricValue(t, n, "peat_mqtt_sessions_adopted_total")
		expired += metricValue(t, n, "peat_mqtt_sessions_expired_total")
	}
	if adopted != 1 || expired != 1 {
		t.Fatalf("the surviving nodes count %v sessions adopted and %v expired, want 1 and 1", adopted, expired)
	}
	if _, present := v5Client(t, others[0], "orphan", 3, nil); present {
		t.Fatal("a session past its expiry since its node crashed is present on another node")
	}
}

// A session disconnected from a node that crashes before its expiry ran
// out is expired by the site all the same, from its disconnect.
func TestCluster_OrphanedDisconnectedSessionExpires(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	_, followers := sessionsLeader(t, nodes)
	home := followers[0]
	var rest []*Node
	for _, n := range nodes {
		if n != home {
			rest = append(rest, n)
		}
	}
	v5Session(t, home, "left", 4, "sensors/#") // subscribes, then disconnects normally
	if !sessionStored(t, rest[0], "left") {
		t.Fatal("the disconnected session is not stored on the other nodes")
	}
	killNode(t, home)
	waitSessionGone(t, rest, "left")
	if v5Session(t, rest[1], "left", 4, "") {
		t.Fatal("a session past its expiry, its node crashed, is present on another node")
	}
}

// The site expires a crashed node's sessions by their own expiry: ones
// with a long expiry, and an MQTT 3.1.1 persistent session (the server's
// maximum: never), are still there once a short one beside them has
// gone, and their clients, back on the node that adopted them (the
// sessions' leader) and on the other, resume them with their
// subscriptions and the messages published while they were away.
func TestCluster_OrphanedSessionKeepsItsExpiry(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	leader, followers := sessionsLeader(t, nodes)
	home, other := followers[1], followers[0]
	for _, id := range []string{"keeper1", "keeper2"} {
		c, _ := v5Client(t, home, id, 300, nil)
		v5Subscribe(t, c, "sensors/#")
	}
	v3 := connectSite(t, home, "v3keeper", false, nil)
	if tok := v3.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	short, _ := v5Client(t, home, "short", 2, nil)
	v5Subscribe(t, short, "sensors/#")
	killNode(t, home)
	publishQoS1(t, leader.MQTTAddr(), "sensors/away", 3)
	rest := []*Node{leader, other}
	waitSessionGone(t, rest, "short") // the site has dealt with the crashed node's sessions
	for _, n := range rest {
		for _, id := range []string{"keeper1", "keeper2", "v3keeper"} {
			if !sessionStored(t, n, id) {
				t.Fatalf("%s's session, within its expiry, is gone from %s", id, n.cfg.Cluster.NodeID)
			}
		}
	}
	for id, n := range map[string]*Node{"keeper1": leader, "keeper2": other} {
		got := make(chan string, 100)
		if _, present := v5Client(t, n, id, 300, got); !present {
			t.Fatalf("%s's session, within its expiry, is not present on %s after its node crashed", id, n.cfg.Cluster.NodeID)
		}
		expectAll(t, got, "sensors/away m0", "sensors/away m1", "sensors/away m2")
	}
	got := make(chan string, 100)
	if c := connectSite(t, other, "v3keeper", false, got); !c.present {
		t.Fatal("an MQTT 3.1.1 persistent session is not present on another node after its node crashed")
	}
	expectAll(t, got, "sensors/away m0", "sensors/away m1", "sensors/away m2")
}

// A node that restarts does not read its sessions again (a client's
// session is read when it connects): the site expires those it held as
// a crashed node's, in its new broker epoch.
func TestCluster_RestartedNodesSessionExpires(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	v5Session(t, nodes[2], "restarted", 3, "sensors/#")
	back := restartSiteNode(t, nodes[2], nodes[0])
	waitSessionGone(t, []*Node{nodes[0], nodes[1], back}, "restarted")
	if v5Session(t, back, "restarted", 3, "") {
		t.Fatal("a session past its expiry is present on the node that held it before its restart")
	}
}
