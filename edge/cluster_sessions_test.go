package edge

import (
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// restartSiteNode closes n and starts it again on its data and its own
// cluster addresses (Serf refuses a failed member's name from another
// address), joining seed.
func restartSiteNode(t *testing.T, n, seed *Node) *Node {
	t.Helper()
	old := n.site.Load()
	cfg := n.cfg
	cfg.Cluster.Listen, cfg.Cluster.RaftListen, cfg.Cluster.TransportListen = old.Node.SerfAddr(), old.Node.RaftAddr(), old.Server.Addr()
	cfg.Cluster.Join = []string{seed.site.Load().Node.SerfAddr()}
	closeNode(t, n)
	back := startNode(t, cfg)
	waitFor(t, cfg.Cluster.NodeID+" ready again", func() bool {
		code, _, _ := get(t, "GET", "http://"+back.HTTPAddr().String()+"/readyz")
		return code == 200
	})
	return back
}

// durableClient connects client id with a persistent session (clean
// session false) to n; got receives every payload delivered.
func durableClient(t *testing.T, n *Node, id string, got chan<- string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID(id).SetCleanSession(false).SetAutoReconnect(false).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { got <- string(m.Payload()) }))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	return c
}

// A durable session lives on the node its client uses, and its offsets in
// the stream's state, which the site shares: another node restarting does
// not take them for leftovers of a session it does not know. A client
// offline while records arrive gets every one of them after another node
// and then its own restarted.
func TestCluster_SessionOffsetsSurviveOtherNodes(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	seed, home, other := nodes[0], nodes[1], nodes[2]
	got := make(chan string, 100)
	c := durableClient(t, home, "p1", got)
	if tok := c.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	publishQoS1(t, seed.MQTTAddr(), "sensors/a", 1)
	select {
	case m := <-got:
		if m != "m0" {
			t.Fatalf("got %q, want m0", m)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing delivered")
	}
	c.Disconnect(250)
	publishQoS1(t, seed.MQTTAddr(), "sensors/b", 5) // offline: the session is to get these

	other = restartSiteNode(t, other, seed)
	// A commit through the restarted node's state writer is answered once
	// everything it queued before, at start, is written as well.
	waitFor(t, "a commit through "+other.cfg.Cluster.NodeID, func() bool {
		p := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + other.MQTTAddr().String()).
			SetClientID("committer").SetAutoReconnect(false))
		if tok := p.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			return false
		}
		defer p.Disconnect(0)
		tok := p.Publish("$offsets/x/default", 1, false, "0")
		return tok.WaitTimeout(30*time.Second) && tok.Error() == nil
	})
	home = restartSiteNode(t, home, seed)

	c = durableClient(t, home, "p1", got)
	defer c.Disconnect(0)
	want := map[string]bool{"m0": true, "m1": true, "m2": true, "m3": true, "m4": true}
	deadline := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case m := <-got:
			delete(want, m)
		case <-deadline:
			t.Fatalf("the resumed session did not get %v of the records published while it was offline", want)
		}
	}
}
