package edge

import (
	"testing"
	"time"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/peatsource"
)

// A peat source in a site runs on the mirror stream's leader; the leader
// crashes mid-replay and the new leader resumes at the mirror's end: the
// mirror holds HQ's stream at HQ's offsets, every record once, each with
// its HQ publisher's client id (replicated to the new leader).
func TestCluster_PeatSourceAcrossFailover(t *testing.T) {
	const n = 3000
	hq := startNode(t, testConfig(t))
	publishQoS1(t, hq.MQTTAddr(), "cmd/dev1", n)

	nodes := startSite3(t, func(c *Config) {
		c.Streams = append(c.Streams, StreamConfig{Name: "hq", Mirror: true, Filters: []string{"hq/#"}, Durability: "fsync"})
		c.Sources = []SourceConfig{{
			Name: "hq", Backoff: BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(200 * time.Millisecond)},
			StallAfter: Duration(source.DefaultStallAfter),
			Peat: &SourcePeatConfig{URL: "mqtt://" + hq.MQTTAddr().String(), ClientID: "site-down", Filter: "#",
				Topic: "hq/{topic}", Window: 4, Keepalive: Duration(peatsource.DefaultKeepalive)},
		}}
	})
	leader := leaderOf(t, nodes, "hq")
	old := leader.cfg.Cluster.NodeID
	var others []*Node
	for _, nd := range nodes {
		if nd != leader {
			others = append(others, nd)
		}
	}
	eventually(t, "the leader part way through", func() bool { return leader.Store().Stream("hq").Committed() >= n/5 })
	crashNode(t, leader)
	next := waitNewLeader(t, others, "hq", old)
	st := next.Store().Stream("hq")
	if st.Committed() >= n {
		t.Fatal("the old leader mirrored everything before the crash")
	}
	eventually(t, "the whole stream mirrored on the new leader", func() bool { return st.Committed() >= n })
	time.Sleep(300 * time.Millisecond)
	got, err := st.Read(0, 2*n, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	want, err := hq.Store().Stream("default").Read(0, 2*n, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n || len(want) != n {
		t.Fatalf("mirror %d records, hq %d, want %d", len(got), len(want), n)
	}
	for i := range got {
		if got[i].Offset != want[i].Offset || string(got[i].Payload) != string(want[i].Payload) || got[i].Topic != "hq/"+want[i].Topic ||
			got[i].ClientID != want[i].ClientID {
			t.Fatalf("mirror offset %d: %q %q from %q; hq: %d %q %q from %q", got[i].Offset, got[i].Topic, got[i].Payload, got[i].ClientID,
				want[i].Offset, want[i].Topic, want[i].Payload, want[i].ClientID)
		}
	}
}
