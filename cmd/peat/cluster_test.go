package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/peatmq/peat/cluster"
	"github.com/peatmq/peat/cluster/rules"
)

// `peat cluster` reads a site node's view of its site, as text or JSON,
// and exits 3 against a node outside a cluster.
func TestClusterCommand_AgainstASiteNode(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "peat.yaml")
	yaml := "cluster:\n  name: test-site\n  node_id: n1\n  listen: 127.0.0.1:0\n  expect: 1\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPeat(t, filepath.Join(dir, "data"), "--config", cfg)

	var st cluster.SiteStatus
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, out, stderr := runPeat(t, nil, "cluster", "-o", "json", "--http", p.httpAddr)
		st = cluster.SiteStatus{}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("peat cluster -o json printed no JSON (exit %d): %v\n%s%s", code, err, out, stderr)
		}
		if code == exitOK && len(st.Streams) == 2 { // the sessions' stream comes just after the site is well
			break
		}
		if code != exitOK && code != exitSiteUnwell || time.Now().After(deadline) {
			t.Fatalf("peat cluster -o json: exit %d, want 0 once the site has its stream\n%s%s", code, out, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.NodeID != "n1" || st.Controller != "n1" || !st.IsController || !st.Ready ||
		len(st.Members) != 1 || st.Members[0].State != "alive" || len(st.Streams) != 2 || st.Streams[0].Leader != "n1" ||
		st.Streams[1].Name != cluster.SessionsStream { // the configured stream, then the site's sessions'
		t.Fatalf("peat cluster -o json: %+v", st)
	}

	code, out, stderr := runPeat(t, nil, "cluster", "--http", p.httpAddr)
	if code != exitOK {
		t.Fatalf("peat cluster: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{"node        n1  site test-site  voter", "caught up", "controller  n1 (this node)",
		"members     1 (1 alive)", "n1      alive", "default    n1", "_sessions  n1", "replicas    of the streams this node leads"} {
		if !strings.Contains(out, want) {
			t.Errorf("peat cluster lacks %q:\n%s", want, out)
		}
	}

	// remove-node refuses the site's only voter (the quorum would go with it), and
	// a member the site does not know.
	for _, tc := range []struct{ id, want string }{{"n1", "only voter"}, {"gone", "unknown broker"}} {
		code, out, stderr = runPeat(t, nil, "cluster", "remove-node", "--http", p.httpAddr, tc.id)
		if code != exitSiteUnwell || !strings.Contains(stderr, tc.want) {
			t.Errorf("peat cluster remove-node %s: exit %d, stderr %q, stdout %q; want 1 saying %q", tc.id, code, stderr, out, tc.want)
		}
	}
	if code, _, stderr = runPeat(t, nil, "cluster", "remove-node", "--http", p.httpAddr); code != exitUsage {
		t.Errorf("peat cluster remove-node without an id: exit %d, stderr %q; want 2", code, stderr)
	}
	// keep-node: a member not draining is kept as it is; one the site does
	// not know is refused.
	if code, out, stderr = runPeat(t, nil, "cluster", "keep-node", "--http", p.httpAddr, "n1"); code != exitOK ||
		!strings.Contains(out, "keeping n1 in the site") {
		t.Errorf("peat cluster keep-node n1: exit %d, stdout %q, stderr %q; want 0", code, out, stderr)
	}
	if code, out, stderr = runPeat(t, nil, "cluster", "keep-node", "--http", p.httpAddr, "gone"); code != exitSiteUnwell ||
		!strings.Contains(stderr, "unknown broker") {
		t.Errorf("peat cluster keep-node gone: exit %d, stdout %q, stderr %q; want 1 saying unknown broker", code, out, stderr)
	}

	// rebalance: one node holds every replica, nothing to move.
	if code, out, stderr = runPeat(t, nil, "cluster", "rebalance", "--http", p.httpAddr); code != exitOK ||
		!strings.Contains(out, "nothing to move") || !strings.Contains(out, "(n1 2)") {
		t.Errorf("peat cluster rebalance: exit %d, stdout %q, stderr %q; want 0 saying nothing to move", code, out, stderr)
	}
	if code, _, stderr = runPeat(t, nil, "cluster", "rebalance", "--http", p.httpAddr, "n1"); code != exitUsage {
		t.Errorf("peat cluster rebalance n1: exit %d, stderr %q; want 2", code, stderr)
	}

	single := startPeat(t, t.TempDir())
	code, _, stderr = runPeat(t, nil, "cluster", "--http", single.httpAddr)
	if code != exitUnknown || !strings.Contains(stderr, "not in a cluster") {
		t.Errorf("peat cluster against a single node: exit %d, stderr %q; want 3 saying it is not in a cluster", code, stderr)
	}
}

// The rebalance's moves and the streams still moving are printed as an
// operator reads them: stream, from -> to.
func TestCluster_PrintMoves(t *testing.T) {
	var b strings.Builder
	printRebalance(&b, &cluster.Rebalancing{Moves: []rules.StreamMove{{Stream: "default", From: "n1", To: "n4"}},
		Replicas: map[string]int{"n1": 2, "n2": 3, "n4": 2}, Balanced: true})
	for _, want := range []string{"moving 1 replica(s)", "  default: n1 -> n4\n", "replicas per node once done: n1 2, n2 3, n4 2"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("rebalance output lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printRebalance(&b, &cluster.Rebalancing{Replicas: map[string]int{"n1": 3, "n2": 1}})
	if !strings.Contains(b.String(), "nothing can move now (n1 3, n2 1)") {
		t.Errorf("rebalance output with nothing movable:\n%s", b.String())
	}
	b.Reset()
	printCluster(&b, &cluster.SiteStatus{NodeID: "n1", Ready: true, Streams: []cluster.StreamStatus{{Name: "default",
		Leader: "n1", Replicas: []string{"n1", "n4", "n2"}, ISR: []string{"n1", "n2"}, ReplicationFactor: 2,
		UnderReplicated: true, Moving: []rules.ReplicaMove{{From: "n1", To: "n4"}}}}})
	if !strings.Contains(b.String(), "UNDER-REPLICATED, moving n1 -> n4") {
		t.Errorf("peat cluster does not show the move:\n%s", b.String())
	}
}
