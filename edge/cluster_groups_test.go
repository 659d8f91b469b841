package edge

import (
	"context"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/logstore"
)

// groupClient connects a v3.1.1 client with id to addr.
func groupClient(tb testing.TB, n *Node, id string) paho.Client {
	tb.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID(id).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("connect %s: %v", id, tok.Error())
	}
	tb.Cleanup(func() { c.Disconnect(0) })
	return c
}

// subCode subscribes c to filter at QoS 1 and returns the SUBACK's code
// (0x80: refused).
func subCode(tb testing.TB, c paho.Client, filter string) byte {
	tb.Helper()
	tok := c.Subscribe(filter, 1, nil)
	if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		tb.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	return tok.(*paho.SubscribeToken).Result()[filter]
}

// A consumer group has one consumer across the site, through MQTT: a
// second member's $group subscription on another node is refused while
// the first is connected, on the node that leads the stream next as
// soon as the leader has stopped too; once the first disconnects, the
// second gets the group.
func TestCluster_GroupOneConsumerAcrossFailover(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	leader, others := streamLeader(t, nodes)
	st, _ := leader.site.Load().Node.State()
	// The next leader is the first replica after the leader (all in the ISR).
	var next, far *Node
	for _, id := range st.Streams[logstore.DefaultStreamName].Replicas {
		for _, n := range others {
			if n.cfg.Cluster.NodeID == id {
				if next == nil {
					next = n
				} else {
					far = n
				}
			}
		}
	}
	const filter = "$group/g/+/sensors/#"
	c1 := groupClient(t, far, "c1")
	if code := subCode(t, c1, filter); code != 1 {
		t.Fatalf("first member's SUBACK %#x, want 1", code)
	}
	c2 := groupClient(t, next, "c2")
	if code := subCode(t, c2, filter); code != 0x80 {
		t.Fatalf("second member's SUBACK %#x, want 0x80", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := leader.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, next.cfg.Cluster.NodeID+" to lead the stream", func() bool {
		st, _ := next.site.Load().Node.State()
		return st.Streams[logstore.DefaultStreamName].Leader == next.cfg.Cluster.NodeID
	})
	if code := subCode(t, c2, filter); code != 0x80 {
		t.Fatalf("second member's SUBACK on the new leader %#x, want 0x80", code)
	}
	c1.Disconnect(250)
	eventually(t, "the second member to get the group", func() bool { return subCode(t, c2, filter) == 1 })
}
