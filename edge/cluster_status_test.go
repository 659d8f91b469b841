package edge

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/edge/status"
	"github.com/peatmq/peat/logstore"
)

// clusterView is GET /api/v1/cluster of n.
func clusterView(t *testing.T, n *Node) cluster.SiteStatus {
	t.Helper()
	code, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/api/v1/cluster")
	if code != 200 {
		t.Fatalf("/api/v1/cluster: %d %s", code, body)
	}
	var st cluster.SiteStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("/api/v1/cluster: %v: %s", err, body)
	}
	return st
}

func streamOf(st cluster.SiteStatus, name string) *cluster.StreamStatus {
	for i := range st.Streams {
		if st.Streams[i].Name == name {
			return &st.Streams[i]
		}
	}
	return nil
}

func memberStates(st cluster.SiteStatus) map[string]string {
	out := map[string]string{}
	for _, m := range st.Members {
		out[m.ID] = m.State
	}
	return out
}

// metricValue is the value of the series line (name and labels as
// /metrics writes them) on n, -1 when it is missing.
func metricValue(t *testing.T, n *Node, series string) float64 {
	t.Helper()
	_, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/metrics")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

// /api/v1/cluster, /metrics and /api/v1/status show a three-node site as
// an operator needs it: every member alive, one controller all agree on,
// the default stream on three replicas all in sync with no lag; and when
// a node stops, the others report it failed, the ISR at two and the
// stream under-replicated.
func TestCluster_StatusAPI(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	leader, others := streamLeader(t, nodes)
	publishQoS1(t, leader.MQTTAddr(), "sensors/t", 20)

	eventually(t, "every node to see three alive members and the same controller", func() bool {
		ctl := ""
		for _, n := range nodes {
			st := clusterView(t, n)
			states := memberStates(st)
			if len(states) != 3 || states["n1"] != "alive" || states["n2"] != "alive" || states["n3"] != "alive" {
				return false
			}
			if st.Controller == "" || (ctl != "" && st.Controller != ctl) {
				return false
			}
			ctl = st.Controller
		}
		return true
	})
	controllers := 0
	for _, n := range nodes {
		st := clusterView(t, n)
		if st.IsController {
			controllers++
			if st.Controller != st.NodeID {
				t.Errorf("%s says it is controller, but names %s", st.NodeID, st.Controller)
			}
		}
		if len(st.Voters) != 3 {
			t.Errorf("%s: voters %v, want 3", st.NodeID, st.Voters)
		}
		if got := metricValue(t, n, "peat_cluster_controller_changes_total"); got < 1 {
			t.Errorf("%s: peat_cluster_controller_changes_total %v, want at least the first controller", st.NodeID, got)
		}
		for _, m := range st.Members {
			if m.Role != "voter" || m.MQTTAddr == "" || m.ClusterAddr == "" || m.BrokerEpoch == 0 {
				t.Errorf("%s: member %+v lacks its tags", st.NodeID, m)
			}
		}
	}
	if controllers != 1 {
		t.Fatalf("%d nodes say they are controller, want 1", controllers)
	}

	st := clusterView(t, leader)
	s := streamOf(st, logstore.DefaultStreamName)
	if s == nil || len(s.Replicas) != 3 || len(s.ISR) != 3 || s.UnderReplicated || s.Leader != st.NodeID {
		t.Fatalf("default stream on its leader: %+v", s)
	}
	// Every acks=all publish was acknowledged: the ISR holds them all.
	if s.HighWatermark != 20 || s.LogEnd != 20 || len(s.ReplicaLag) != 3 {
		t.Fatalf("leader's replica: watermark %d, log end %d, lag %+v; want 20, 20, three replicas",
			s.HighWatermark, s.LogEnd, s.ReplicaLag)
	}
	for _, r := range s.ReplicaLag {
		if !r.Fetched || r.LogEnd != 20 || r.LagRecords != 0 || !r.InISR {
			t.Errorf("replica %+v, want log end 20, lag 0, in the ISR", r)
		}
		series := `peat_replica_lag_records{replica="` + r.ID + `",stream="default"}`
		if got := metricValue(t, leader, series); got != 0 {
			t.Errorf("%s = %v, want 0", series, got)
		}
	}
	if fs := streamOf(clusterView(t, others[0]), logstore.DefaultStreamName); fs == nil || len(fs.ReplicaLag) != 0 || !fs.LocalReplica {
		t.Errorf("a follower's view of the stream: %+v (replica lag is the leader's to tell)", fs)
	}
	for series, want := range map[string]float64{
		`peat_stream_isr_size{stream="default"}`:         3,
		`peat_stream_replicas{stream="default"}`:         3,
		`peat_stream_under_replicated{stream="default"}`: 0,
		`peat_cluster_members{state="alive"}`:            3,
		`peat_cluster_caught_up`:                         1,
	} {
		if got := metricValue(t, others[0], series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if got := metricValue(t, leader, `peat_cluster_leader_elections_total{stream="default"}`); got < 1 {
		t.Errorf("peat_cluster_leader_elections_total = %v, want at least the first election", got)
	}
	doc := getStatus(t, others[0])
	if doc.Cluster == nil || doc.Cluster.NodeID != others[0].cfg.Cluster.NodeID || len(doc.Cluster.Members) != 3 {
		t.Fatalf("/api/v1/status cluster block: %+v", doc.Cluster)
	}
	if len(doc.Alarms) != 0 {
		t.Fatalf("alarms on a healthy site: %+v", doc.Alarms)
	}
	// Every node holds every stream: nothing to rebalance.
	code, _, body := get(t, "POST", "http://"+others[0].HTTPAddr().String()+"/api/v1/cluster/rebalance")
	var rb cluster.Rebalancing
	if err := json.Unmarshal(body, &rb); code != 200 || err != nil || rb.Moves == nil || len(rb.Moves) != 0 ||
		!rb.Balanced || len(rb.Replicas) != 3 {
		t.Fatalf("POST /api/v1/cluster/rebalance: %d %s, want 200 with no moves on a balanced site", code, body)
	}

	// A follower stops.
	gone := others[0]
	id := gone.cfg.Cluster.NodeID
	closeNode(t, gone)
	stay := []*Node{leader, others[1]}
	eventually(t, "the others to report "+id+" failed and the ISR at 2", func() bool {
		for _, n := range stay {
			st := clusterView(t, n)
			s := streamOf(st, logstore.DefaultStreamName)
			if memberStates(st)[id] != "failed" || s == nil || len(s.ISR) != 2 || slices.Contains(s.ISR, id) {
				return false
			}
		}
		return true
	})
	for _, n := range stay {
		if got := metricValue(t, n, `peat_stream_under_replicated{stream="default"}`); got != 1 {
			t.Errorf("%s: peat_stream_under_replicated = %v, want 1", n.cfg.Cluster.NodeID, got)
		}
		if got := metricValue(t, n, `peat_cluster_members{state="failed"}`); got != 1 {
			t.Errorf("%s: peat_cluster_members{state=failed} = %v, want 1", n.cfg.Cluster.NodeID, got)
		}
		if got := metricValue(t, n, `peat_stream_isr_size{stream="default"}`); got != 2 {
			t.Errorf("%s: peat_stream_isr_size = %v, want 2", n.cfg.Cluster.NodeID, got)
		}
	}
	if s := streamOf(clusterView(t, leader), logstore.DefaultStreamName); s == nil || !s.UnderReplicated {
		t.Errorf("the stream is not reported under-replicated: %+v", s)
	}
	doc = getStatus(t, leader)
	if len(doc.Alarms) != 1 || doc.Alarms[0].ID != status.AlarmUnderReplicated || !strings.Contains(doc.Alarms[0].Message, "default") {
		t.Errorf("alarms with a replica gone: %+v, want stream_under_replicated naming the stream", doc.Alarms)
	}
	_, _, page := get(t, "GET", "http://"+leader.HTTPAddr().String()+"/")
	if !strings.Contains(string(page), "stream default is under-replicated") {
		t.Errorf("the status page does not show the under-replicated stream")
	}
	// The page's site section: every member with its state, and the
	// stream's leader and shrunk ISR, before any script runs.
	want := []string{
		`<tr data-member="` + id + `"><td>` + id + `</td><td class="state failed" data-field="state">failed</td>`,
		`<tr data-stream="default" class="warning"><td>default</td><td data-field="leader">` + leader.cfg.Cluster.NodeID + `</td>`,
		`<td data-field="isr">` + strings.Join(streamOf(clusterView(t, leader), logstore.DefaultStreamName).ISR, " ") + `</td>`,
	}
	for _, w := range want {
		if !strings.Contains(string(page), w) {
			t.Errorf("the status page lacks %s", w)
		}
	}
}

// closeNode stops n now (its Cleanup's Close then does nothing more).
func closeNode(t *testing.T, n *Node) {
	t.Helper()
	if err := n.Close(t.Context()); err != nil {
		t.Fatalf("close %s: %v", n.cfg.Cluster.NodeID, err)
	}
}

// A restarted replica is not ready (/readyz 503, with the reason) until
// it is back in its stream's ISR: cut off from the site it stays so, and
// once it rejoins and catches up it is ready, in the ISR in its new
// broker epoch.
func TestCluster_ReadyzWhileNotCaughtUp(t *testing.T) {
	nodes := startSiteNodes(t, 3)
	leader, others := streamLeader(t, nodes)
	// Every node ready first, as a load balancer would have it before
	// sending clients: right after the site forms, a publish may still
	// be refused while the leader takes up its role (a 3.1.1 client is
	// then disconnected).
	for _, n := range nodes {
		eventually(t, n.cfg.Cluster.NodeID+" ready", func() bool {
			code, _, _ := get(t, "GET", "http://"+n.HTTPAddr().String()+"/readyz")
			return code == 200
		})
	}
	publishQoS1(t, leader.MQTTAddr(), "sensors/t", 10)
	gone := others[0]
	id := gone.cfg.Cluster.NodeID
	old := gone.site.Load()
	serfAddr, raftAddr, transport := old.Node.SerfAddr(), old.Node.RaftAddr(), old.Server.Addr()
	closeNode(t, gone)
	eventually(t, id+" out of the ISR", func() bool {
		st, _ := leader.site.Load().Node.State()
		return !st.Streams[logstore.DefaultStreamName].InISR(id)
	})
	publishQoS1(t, leader.MQTTAddr(), "sensors/t", 10) // it misses these

	// Back on its data, but cut off: no join address, no Serf snapshot,
	// new ports (0), so no one reaches it.
	cfg := gone.cfg
	cfg.Cluster.Join = nil
	if err := os.Remove(filepath.Join(cfg.DataDir, "serf.snapshot")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	cut := startNode(t, cfg)
	code, _, body := get(t, "GET", "http://"+cut.HTTPAddr().String()+"/readyz")
	if code != 503 || !strings.Contains(string(body), "not caught up") {
		t.Fatalf("/readyz of a replica cut off from its site: %d %s, want 503 not caught up", code, body)
	}
	if got := metricValue(t, cut, "peat_cluster_caught_up"); got != 0 {
		t.Errorf("peat_cluster_caught_up = %v, want 0", got)
	}
	if st := clusterView(t, cut); st.Ready || st.NotReady == "" {
		t.Errorf("/api/v1/cluster: ready %v, reason %q", st.Ready, st.NotReady)
	}
	if doc := getStatus(t, cut); !slices.ContainsFunc(doc.Alarms, func(a status.Alarm) bool { return a.ID == status.AlarmNotCaughtUp }) {
		t.Errorf("no not_caught_up alarm in the status document: %+v", doc.Alarms)
	}
	closeNode(t, cut)

	// Back at its own addresses (Serf refuses a failed member's name from
	// another address), joining the site: ready once it has caught up.
	cfg.Cluster.Listen, cfg.Cluster.RaftListen, cfg.Cluster.TransportListen = serfAddr, raftAddr, transport
	cfg.Cluster.Join = []string{leader.site.Load().Node.SerfAddr()}
	back := startNode(t, cfg)
	ready := "http://" + back.HTTPAddr().String() + "/readyz"
	var reasons []string
	eventually(t, id+" ready again", func() bool {
		code, _, body := get(t, "GET", ready)
		if code != 200 && !slices.Contains(reasons, string(body)) {
			reasons = append(reasons, string(body))
		}
		return code == 200
	})
	t.Logf("/readyz said, before it was ready: %q", reasons)
	st, _ := back.site.Load().Node.State()
	if s := st.Streams[logstore.DefaultStreamName]; !s.InISR(id) || st.Brokers[id].Epoch != back.site.Load().Node.Epoch() {
		t.Fatalf("ready, but the state has ISR %v and %s in epoch %d (runs %d)", s.ISR, id,
			st.Brokers[id].Epoch, back.site.Load().Node.Epoch())
	}
	if got := back.Store().Stream(logstore.DefaultStreamName).Committed(); got < 20 {
		t.Fatalf("ready with %d records committed, want the 20 the site committed", got)
	}
}

// Outside a site /api/v1/cluster is a 404 saying so, and the status
// document has no cluster block.
func TestCluster_StatusAPIOutsideASite(t *testing.T) {
	n := startNode(t, testConfig(t))
	code, _, body := get(t, "GET", "http://"+n.HTTPAddr().String()+"/api/v1/cluster")
	if code != 404 || !strings.Contains(string(body), "not in a cluster") {
		t.Fatalf("/api/v1/cluster on a single node: %d %s", code, body)
	}
	code, _, body = get(t, "POST", "http://"+n.HTTPAddr().String()+"/api/v1/cluster/rebalance")
	if code != 404 || !strings.Contains(string(body), "not in a cluster") {
		t.Fatalf("POST /api/v1/cluster/rebalance on a single node: %d %s", code, body)
	}
	_, _, body = get(t, "GET", "http://"+n.HTTPAddr().String()+"/api/v1/status")
	if strings.Contains(string(body), `"cluster"`) {
		t.Fatalf("a single node's status has a cluster block")
	}
	if got := metricValue(t, n, `peat_cluster_caught_up`); got != -1 {
		t.Fatalf("a single node exports peat_cluster_caught_up")
	}
}
