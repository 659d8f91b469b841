package edge

import (
	"fmt"
	"testing"
	"time"

	"github.com/peatmq/peat/edge/sink/sinktest"
	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/logstore"
)

// sourceOn is the status of the node's only source.
func sourceOn(t *testing.T, n *Node) source.Status {
	t.Helper()
	st := sourceStatuses(t, n)
	if len(st) != 1 {
		t.Fatalf("%s: sources %+v, want one", n.cfg.Cluster.NodeID, st)
	}
	return st[0]
}

// TestCluster_SourceRunsOnTheStreamLeaderAndMovesWithIt: in a site the
// source runs on the node that leads its stream (the others show it on
// standby, naming that node); a device subscribed on any node receives
// the commands published in the cloud. The leader is killed while the
// cloud publishes at QoS 2: the new leader takes the session up under
// the same client id and goes on, and the site's log holds every command
// exactly once.
func TestCluster_SourceRunsOnTheStreamLeaderAndMovesWithIt(t *testing.T) {
	cloud := sinktest.StartMosquitto(t)
	nodes := startSite3(t, func(c *Config) {
		c.Sources = sourceConfig(t, cloud).Sources
		c.Sources[0].MQTT.Subscribe[0].QoS = 2
		c.Sources[0].MQTT.Keepalive = Duration(2 * time.Second)
	})
	leader, others := streamLeader(t, nodes)
	old := leader.cfg.Cluster.NodeID
	eventually(t, "the source connected on the leader, on standby elsewhere", func() bool {
		for _, n := range others {
			if s := sourceOn(t, n); s.State != source.StateStandby || s.Leader != old {
				return false
			}
		}
		return sourceOn(t, leader).State == source.StateConnected
	})

	devices := []*subscriber{
		subscribe(t, others[0].MQTTAddr().String(), "dev-a", "cmd/#"),
		subscribe(t, others[1].MQTTAddr().String(), "dev-b", "cmd/#"),
	}
	publishTo(t, cloud, "site-a/cmd/dev1", false, "c0")
	for i, d := range devices {
		eventually(t, fmt.Sprintf("the command at device %d", i), func() bool { return len(d.messages()) == 1 })
		if m := d.messages()[0]; m.Topic() != "cmd/dev1" || string(m.Payload()) != "c0" {
			t.Fatalf("device %d got %s %q", i, m.Topic(), m.Payload())
		}
	}

	// Kill the leader while the cloud goes on publishing.
	const n = 200
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= n; i++ {
			publishQoS2To(t, cloud, "site-a/cmd/dev1", fmt.Sprintf("c%d", i))
		}
	}()
	eventually(t, "some commands in the site's log", func() bool {
		return others[0].Store().Stream(logstore.DefaultStreamName).Committed() > 30
	})
	crashNode(t, leader)
	next := waitNewLeader(t, others, logstore.DefaultStreamName, old)
	<-done
	eventually(t, "the source connected on the new leader", func() bool { return sourceOn(t, next).State == source.StateConnected })
	log := next.Store().Stream(logstore.DefaultStreamName)
	eventually(t, "every command in the site's log", func() bool { return log.Committed() >= n+1 })
	time.Sleep(500 * time.Millisecond) // a duplicate would land meanwhile
	recs, err := log.Read(0, int(log.Committed())+10, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range recs {
		count[string(r.Payload)]++
	}
	for i := 0; i <= n; i++ {
		if c := count[fmt.Sprintf("c%d", i)]; c != 1 {
			t.Errorf("c%d is in the site's log %d times, want once", i, c)
		}
	}
	t.Logf("%d records, the source on %s then %s", len(recs), old, next.cfg.Cluster.NodeID)
}

// publishQoS2To publishes one QoS 2 message to the broker at addr.
func publishQoS2To(t testing.TB, addr, topic, payload string) {
	t.Helper()
	publishQoS(t, addr, topic, 2, payload)
}
