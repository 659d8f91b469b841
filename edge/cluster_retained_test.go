package edge

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/peatmq/peat/logstore"
)

// retainedSeen is one delivery a subscriber saw.
type retainedSeen struct {
	payload  string
	retained bool
}

// siteSubscriber connects a clean client to n, subscribes to filter at
// QoS 1 and records every delivery.
func siteSubscriber(t *testing.T, n *Node, id, filter string) (got func() []retainedSeen) {
	t.Helper()
	var mu sync.Mutex
	var seen []retainedSeen
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + n.MQTTAddr().String()).
		SetClientID(id).SetAutoReconnect(false).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			mu.Lock()
			seen = append(seen, retainedSeen{string(m.Payload()), m.Retained()})
			mu.Unlock()
		}))
	if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	if tok := c.Subscribe(filter, 1, nil); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", id, tok.Error())
	}
	return func() []retainedSeen {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// In a site, a retained message published through one node reaches a
// new subscriber on every node once, flagged retained, and the newest
// value only: each node's retained set comes from its replica of the
// log. A live record after it is delivered live (retain flag cleared for
// MQTT 3.1.1) and the retained one is not sent again.
func TestCluster_RetainedOnEveryNode(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	_, others := streamLeader(t, nodes)
	publishRetained(t, others[0].MQTTAddr(), "sensors/a", "r1", true)
	publishRetained(t, others[1].MQTTAddr(), "sensors/a", "r2", true) // the newer value
	// A follower learns the high watermark with its next fetch: a client
	// subscribing there before that gets r2 live, as MQTT allows.
	for _, n := range nodes {
		s := n.Store().Stream(logstore.DefaultStreamName)
		eventually(t, n.cfg.Cluster.NodeID+" to hold both records committed", func() bool { return s.Committed() >= 2 })
	}
	for round, n := range nodes {
		id := n.cfg.Cluster.NodeID
		got := siteSubscriber(t, n, fmt.Sprintf("rsub-%s", id), "sensors/#")
		marker := fmt.Sprintf("live-%d", round)
		eventually(t, id+"'s subscriber to get the retained value", func() bool { return len(got()) >= 1 })
		publishRetained(t, nodes[(round+1)%len(nodes)].MQTTAddr(), "sensors/b", marker, false)
		eventually(t, id+"'s subscriber to get "+marker, func() bool {
			s := got()
			return len(s) > 0 && s[len(s)-1].payload == marker
		})
		want := []retainedSeen{{"r2", true}, {marker, false}}
		if s := got(); !slices.Equal(s, want) {
			t.Fatalf("subscriber on %s got %+v, want %+v (the newest retained value once, flagged, then the live record)", id, s, want)
		}
	}
}
