package edge

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/edge/source"
	"github.com/peatmq/peat/edge/source/kafkasource"
)

// A kafka source in a site runs on the leader of its stream; the leader
// crashes mid-drain and the new leader goes on from the Kafka positions
// in the replicated records: the stream holds every Kafka record once.
func TestCluster_KafkaSourceExactlyOnceAcrossFailover(t *testing.T) {
	const n = 6000
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "commands"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic("commands"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Key: []byte("dev" + strconv.Itoa(i%5)), Value: []byte(strconv.Itoa(i))})
	}
	if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	nodes := startSite3(t, func(c *Config) {
		c.Streams = append(c.Streams, StreamConfig{Name: "cmds", Filters: []string{"cmd/#"}, Durability: "fsync"})
		c.Sources = []SourceConfig{{
			Name: "lake", Backoff: BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(200 * time.Millisecond)},
			StallAfter: Duration(source.DefaultStallAfter),
			Kafka: &SourceKafkaConfig{Brokers: kc.ListenAddrs(), Topics: []string{"commands"}, Topic: "cmd/{key}",
				QoS: 1, Isolation: IsolationReadCommitted, Start: kafkasource.StartEarliest, MaxBatch: 5,
				Timeout: Duration(10 * time.Second)},
		}}
	})
	leader := leaderOf(t, nodes, "cmds")
	old := leader.cfg.Cluster.NodeID
	var others []*Node
	for _, nd := range nodes {
		if nd != leader {
			others = append(others, nd)
		}
	}
	eventually(t, "the leader part way through", func() bool { return leader.Store().Stream("cmds").Committed() >= n/5 })
	crashNode(t, leader)
	next := waitNewLeader(t, others, "cmds", old)
	st := next.Store().Stream("cmds")
	if st.Committed() >= n {
		t.Fatal("the old leader drained everything before the crash")
	}
	eventually(t, "every record in the new leader's stream", func() bool { return st.Committed() >= n })
	time.Sleep(500 * time.Millisecond) // a duplicate would land meanwhile
	got, err := st.Read(0, 2*n, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range got {
		count[string(r.Payload)]++
	}
	for i := range n {
		if c := count[strconv.Itoa(i)]; c != 1 {
			t.Errorf("Kafka value %d stored %d times, want once", i, c)
		}
	}
	if len(got) != n {
		t.Errorf("%d records stored for %d in Kafka", len(got), n)
	}
}
