package edge

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/peatmq/peat/logstore"
)

// kafkaOffsets reads every committed record of topics and returns, per
// peat-stream, how many times each peat-offset arrived and from which
// transactional producer node ({node} is the key).
type kafkaOffsets map[string]map[uint64]int

func readKafka(t *testing.T, addrs []string, topics ...string) func() kafkaOffsets {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	got := kafkaOffsets{}
	return func() kafkaOffsets {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		for _, r := range cl.PollFetches(ctx).Records() {
			var stream, off string
			for _, h := range r.Headers {
				switch h.Key {
				case "peat-stream":
					stream = string(h.Value)
				case "peat-offset":
					off = string(h.Value)
				}
			}
			o, err := strconv.ParseUint(off, 10, 64)
			if err != nil {
				t.Fatalf("record without a peat-offset header: %v", r.Headers)
			}
			if got[stream] == nil {
				got[stream] = map[uint64]int{}
			}
			got[stream][o]++
		}
		return got
	}
}

// TestCluster_KafkaSinkInASite: a site's exactly_once Kafka sink, its
// streams led by different nodes. Each leader produces with its own
// transactional id (with one, they would keep fencing each other), and
// when the leader of a stream is killed the new one resumes after what
// Kafka holds: every record of every stream exactly once, by edge
// offset.
func TestCluster_KafkaSinkInASite(t *testing.T) {
	streams := []string{"a", "b", logstore.DefaultStreamName}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "edge.a", "edge.b", "edge.default"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	nodes := startSite3(t, func(c *Config) {
		c.Streams = []StreamConfig{defaultStream("a", "a/#"), defaultStream("b", "b/#"), defaultStream(logstore.DefaultStreamName, "#")}
		s := defaultSink()
		s.Name = "lake"
		s.Backoff = BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(500 * time.Millisecond)}
		k := defaultSinkKafka()
		k.Brokers, k.Topic, k.ExactlyOnce, k.Window = kc.ListenAddrs(), "edge.{stream}", true, 16
		s.Kafka = &k
		c.Sinks = []SinkConfig{s}
	})
	leaders := map[string]bool{}
	for _, s := range streams {
		leaders[leaderOf(t, nodes, s).cfg.Cluster.NodeID] = true
	}
	if len(leaders) < 2 {
		t.Fatalf("the streams %v all have one leader: the test needs two nodes producing at once", streams)
	}
	poll := readKafka(t, kc.ListenAddrs(), "edge.a", "edge.b", "edge.default")
	for _, s := range streams {
		publishQoS1(t, nodes[0].MQTTAddr(), s+"/x", 30) // default captures default/x
	}
	eventually(t, "30 records of each stream in Kafka", func() bool {
		got := poll()
		for _, s := range streams {
			if len(got[s]) < 30 {
				return false
			}
		}
		return true
	})

	// Nodes producing at once never fenced each other: no connection
	// to Kafka failed.
	for _, n := range nodes {
		_, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/metrics")
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "peat_sink_errors_total{") && strings.Contains(line, `sink="lake"`) && !strings.HasSuffix(line, " 0") {
				t.Errorf("%s: %s: its producer failed (fenced by another node's?)", n.cfg.Cluster.NodeID, line)
			}
		}
	}
	old := leaderOf(t, nodes, logstore.DefaultStreamName)
	var survivors []*Node
	for _, n := range nodes {
		if n != old {
			survivors = append(survivors, n)
		}
	}
	crashNode(t, old)
	waitNewLeader(t, survivors, logstore.DefaultStreamName, old.cfg.Cluster.NodeID)
	for _, s := range streams {
		waitNewLeader(t, survivors, s, old.cfg.Cluster.NodeID)
		publishQoS1(t, survivors[0].MQTTAddr(), s+"/y", 20)
	}
	var got kafkaOffsets
	eventually(t, "50 records of each stream in Kafka", func() bool {
		got = poll()
		for _, s := range streams {
			if len(got[s]) < 50 {
				return false
			}
		}
		return true
	})
	for _, s := range streams {
		for off := range uint64(50) {
			if n := got[s][off]; n != 1 {
				t.Errorf("stream %s offset %d is in Kafka %d times, want once", s, off, n)
			}
		}
	}
}

// TestCluster_PeatSinkInASite: a site mirrors its stream into another
// Peat, and the leader is killed mid-drain: the mirror ends up with the
// site's committed records at the site's offsets, the failover's resends
// acknowledged without a second copy.
func TestCluster_PeatSinkInASite(t *testing.T) {
	hubCfg := testConfig(t)
	hubCfg.Streams = append(hubCfg.Streams, StreamConfig{Name: "site-a.default", Mirror: true, Filters: []string{"site-a/#"}, Durability: "fsync"})
	hub := startNode(t, hubCfg)
	nodes := startSite3(t, func(c *Config) {
		s := defaultSink()
		s.Name = "hq"
		s.MaxRate = 200 // the kill lands mid-drain
		s.Backoff = BackoffConfig{Min: Duration(50 * time.Millisecond), Max: Duration(500 * time.Millisecond)}
		s.Peat = &SinkPeatConfig{URL: "mqtt://" + hub.MQTTAddr().String(), ClientID: "site-a", MirrorAs: "site-a.{stream}",
			Topic: "site-a/{topic}", Window: siteSinkWindow, Keepalive: Duration(30 * time.Second)}
		c.Sinks = []SinkConfig{s}
	})
	leader, others := streamLeader(t, nodes)
	mirror := hub.Store().Stream("site-a.default")
	pub := &publisher{n: others[0], id: "pub"}
	pub.send(t, 400, time.Minute)
	eventually(t, "the mirror part way", func() bool { return mirror.Committed() >= 50 })
	crashNode(t, leader)
	if mirror.Committed() >= 400 {
		t.Fatal("the sink drained everything before the kill: the test did not kill mid-drain")
	}
	next := waitNewLeader(t, others, logstore.DefaultStreamName, leader.cfg.Cluster.NodeID)
	pub.send(t, 100, time.Minute)
	log := next.Store().Stream(logstore.DefaultStreamName)
	eventually(t, "the site committed what it holds", func() bool { return log.Committed() == log.NextOffset() })
	end := log.Committed()
	eventually(t, fmt.Sprintf("the mirror at the site's end %d", end), func() bool { return mirror.Committed() >= end })
	if got := mirror.NextOffset(); got != end {
		t.Fatalf("the mirror holds %d records, the site %d", got, end)
	}
	src, err := log.Read(0, int(end), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := mirror.Read(0, int(end), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if dst[i].Offset != src[i].Offset || string(dst[i].Payload) != string(src[i].Payload) || dst[i].Topic != "site-a/"+src[i].Topic {
			t.Fatalf("mirror offset %d holds %s %q, the site %s %q", dst[i].Offset, dst[i].Topic, dst[i].Payload, src[i].Topic, src[i].Payload)
		}
	}
}
