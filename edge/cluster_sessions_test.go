package edge

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pahov5 "github.com/eclipse/paho.golang/paho"
	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/cluster"
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
	eventually(t, cfg.Cluster.NodeID+" ready again", func() bool {
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
	eventually(t, "a commit through "+other.cfg.Cluster.NodeID, func() bool {
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

// siteClient is a v3.1.1 client of n with id and clean session clean;
// got receives "topic payload" for every message delivered, lost is
// closed when the broker ends the connection. A connection the site
// refuses (its sessions' leader failing over) is tried again.
type siteClient struct {
	paho.Client
	present bool
	lost    chan struct{}
}

func connectSite(t *testing.T, n *Node, id string, clean bool, got chan<- string) *siteClient {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sc := &siteClient{lost: make(chan struct{})}
		var once sync.Once
		sc.Client = paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
			SetClientID(id).SetCleanSession(clean).SetAutoReconnect(false).SetConnectRetry(false).
			SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
				if got != nil {
					got <- m.Topic() + " " + string(m.Payload())
				}
			}).
			SetConnectionLostHandler(func(paho.Client, error) { once.Do(func() { close(sc.lost) }) }))
		tok := sc.Connect()
		if tok.WaitTimeout(30*time.Second) && tok.Error() == nil {
			sc.present = tok.(*paho.ConnectToken).SessionPresent()
			t.Cleanup(func() { sc.Disconnect(0) })
			return sc
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s to %s: %v", id, n.cfg.Cluster.NodeID, tok.Error())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sessionsLeader is the node leading the site's sessions' stream, and
// the others.
func sessionsLeader(t *testing.T, nodes []*Node) (leader *Node, others []*Node) {
	t.Helper()
	var id string
	eventually(t, "the sessions' stream with a full ISR", func() bool {
		st, _ := nodes[0].site.Load().Node.State()
		s := st.Streams[cluster.SessionsStream]
		if s == nil || len(s.ISR) != len(nodes) || s.Leader == "" {
			return false
		}
		id = s.Leader
		return true
	})
	for _, n := range nodes {
		if n.cfg.Cluster.NodeID == id {
			leader = n
		} else {
			others = append(others, n)
		}
	}
	return leader, others
}

// expectAll waits until got has delivered every message of want
// ("topic payload"); others (at least once: an acknowledged message
// again) are allowed.
func expectAll(t *testing.T, got <-chan string, want ...string) {
	t.Helper()
	missing := map[string]bool{}
	for _, w := range want {
		missing[w] = true
	}
	deadline := time.After(60 * time.Second)
	for len(missing) > 0 {
		select {
		case m := <-got:
			delete(missing, m)
		case <-deadline:
			t.Fatalf("never delivered: %v", slices.Sorted(maps.Keys(missing)))
		}
	}
}

// A client's durable session is the site's: its node stopped, the client
// connects to another node with clean session false and without
// subscribing, finds its session present, and gets every message
// published while it was away, none lost. The node that stops leads the
// sessions' stream, so the session's claim and state fail over too.
func TestCluster_SessionResumesOnAnotherNode(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	home, others := sessionsLeader(t, nodes)
	got := make(chan string, 1000)
	c := connectSite(t, home, "roamer", false, got)
	if c.present {
		t.Fatal("a new client's session is present")
	}
	if tok := c.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	publishQoS1(t, others[0].MQTTAddr(), "sensors/before", 3)
	expectAll(t, got, "sensors/before m0", "sensors/before m1", "sensors/before m2")

	closeNode(t, home)
	// Published while the client has no connection, through the node it
	// is to come back to and through the third.
	publishQoS1(t, others[0].MQTTAddr(), "sensors/away1", 5)
	publishQoS1(t, others[1].MQTTAddr(), "sensors/away2", 5)

	c = connectSite(t, others[0], "roamer", false, got)
	if !c.present {
		t.Fatal("the session is not present on another node of the site")
	}
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("sensors/away1 m%d", i), fmt.Sprintf("sensors/away2 m%d", i))
	}
	expectAll(t, got, want...)
	// And it goes on live, from its subscription alone.
	publishQoS1(t, others[1].MQTTAddr(), "sensors/after", 2)
	expectAll(t, got, "sensors/after m0", "sensors/after m1")
}

// One connection per client id, site-wide: a client connecting to
// another node with the same client id takes the session over, and the
// first node closes the first connection; what is published after goes
// to the new connection.
func TestCluster_SessionTakenOverAcrossNodes(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	first := make(chan string, 100)
	c1 := connectSite(t, nodes[1], "dup", false, first)
	if tok := c1.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	publishQoS1(t, nodes[0].MQTTAddr(), "sensors/x", 1)
	expectAll(t, first, "sensors/x m0")

	second := make(chan string, 100)
	c2 := connectSite(t, nodes[2], "dup", false, second)
	select {
	case <-c1.lost:
	case <-time.After(60 * time.Second):
		t.Fatal("the first connection was not closed when the client connected to another node")
	}
	if !c2.present {
		t.Fatal("the session taken over is not present")
	}
	publishQoS1(t, nodes[0].MQTTAddr(), "sensors/y", 3)
	expectAll(t, second, "sensors/y m0", "sensors/y m1", "sensors/y m2")
	for {
		select {
		case m := <-first:
			if strings.HasPrefix(m, "sensors/y") {
				t.Fatalf("the closed connection got %q", m)
			}
			continue
		default:
		}
		break
	}
}

// Clean session (Clean Start 1) on any node ends the stored session
// everywhere: back on the node where it was made, the client finds no
// session and gets nothing of its old subscription.
func TestCluster_CleanStartEndsTheSessionSiteWide(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	got := make(chan string, 100)
	c := connectSite(t, nodes[0], "cleaner", false, got)
	if tok := c.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	c.Disconnect(250)

	c = connectSite(t, nodes[1], "cleaner", true, got)
	c.Disconnect(250)
	publishQoS1(t, nodes[2].MQTTAddr(), "sensors/gone", 2)

	c = connectSite(t, nodes[0], "cleaner", false, got)
	if c.present {
		t.Fatal("the session is present on its old node after a clean start on another")
	}
	// A marker published after, to a topic the client now subscribes to:
	// once it arrives, nothing of the old subscription came before it.
	if tok := c.Subscribe("marker", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	publishQoS1(t, nodes[2].MQTTAddr(), "marker", 1)
	for {
		select {
		case m := <-got:
			if m == "marker m0" {
				return
			}
			if strings.HasPrefix(m, "sensors/gone") {
				t.Fatalf("the ended session's subscription delivered %q", m)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the marker was not delivered")
		}
	}
}

// v5Session connects an MQTT 5 client with Clean Start 0 and Session
// Expiry Interval expiry to n, subscribes it to filter unless filter is
// "", disconnects it normally, and returns the CONNACK's session
// present.
func v5Session(t *testing.T, n *Node, id string, expiry uint32, filter string) bool {
	t.Helper()
	c, present := v5Client(t, n, id, expiry, nil)
	if filter != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := c.Subscribe(ctx, &pahov5.Subscribe{Subscriptions: []pahov5.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
			t.Fatalf("subscribe %s: %v", id, err)
		}
	}
	_ = c.Disconnect(&pahov5.Disconnect{})
	return present
}

// MQTT 5 sessions expire site-wide: one whose Session Expiry Interval
// has passed since it disconnected from one node is not present on
// another, while one still within its interval is.
func TestCluster_SessionExpiresSiteWide(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	v5Session(t, nodes[0], "keeps", 300, "sensors/#")
	v5Session(t, nodes[0], "expires", 1, "sensors/#")
	time.Sleep(2500 * time.Millisecond) // past the second session's expiry: what the test is about
	if !v5Session(t, nodes[1], "keeps", 300, "") {
		t.Fatal("a session within its expiry is not present on another node")
	}
	if v5Session(t, nodes[1], "expires", 300, "") {
		t.Fatal("a session past its expiry is present on another node")
	}
}

// A client back on the node it left finds its session there, and gets
// what was published meanwhile through another node.
func TestCluster_SessionResumesOnItsOwnNode(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	got := make(chan string, 100)
	c := connectSite(t, nodes[1], "homebody", false, got)
	if tok := c.Subscribe("sensors/#", 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	publishQoS1(t, nodes[0].MQTTAddr(), "sensors/a", 2)
	expectAll(t, got, "sensors/a m0", "sensors/a m1")
	c.Disconnect(250)
	publishQoS1(t, nodes[2].MQTTAddr(), "sensors/b", 3)
	c = connectSite(t, nodes[1], "homebody", false, got)
	if !c.present {
		t.Fatal("the session is not present on its own node")
	}
	expectAll(t, got, "sensors/b m0", "sensors/b m1", "sensors/b m2")
}
