package edge

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/peatmq/peat/cluster"
)

// configs/site-3.yaml is pi-a's config of a three-Pi site; pi-b and pi-c
// change the lines its header names. All three must load and validate,
// and describe one site: the same streams, join list and quorum.
func TestConfig_SiteExampleFile(t *testing.T) {
	cfg, err := LoadFile(filepath.Join("..", "configs", "site-3.yaml"))
	if err != nil {
		t.Fatalf("configs/site-3.yaml: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("configs/site-3.yaml is invalid: %v", err)
	}
	if !cfg.Cluster.Enabled() || cfg.Cluster.Expect != 3 || !cfg.Cluster.Voter {
		t.Fatalf("cluster = %+v, want a voter of a three-voter site", cfg.Cluster)
	}
	sc := cfg.SiteConfig()
	if sc.Node.RaftAddr != "192.168.1.11:7947" || sc.TransportListen != "192.168.1.11:7948" {
		t.Errorf("raft %s transport %s, want 192.168.1.11:7947 and :7948", sc.Node.RaftAddr, sc.TransportListen)
	}
	if sc.Node.TLS == nil || sc.Node.KeyringFile == "" {
		t.Errorf("a site on the LAN should show its traffic encrypted: tls %v keyring %q", sc.Node.TLS, sc.Node.KeyringFile)
	}
	wantStreams := []cluster.SiteStream{{Name: "telemetry"}, {Name: "meters"}}
	if !slices.Equal(sc.Streams, wantStreams) {
		t.Errorf("site streams %v, want %v", sc.Streams, wantStreams)
	}
	// The other two Pis: the per-node lines changed as the header says.
	raw, err := os.ReadFile(filepath.Join("..", "configs", "site-3.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	data := string(raw)
	for i, id := range []string{"pi-b", "pi-c"} {
		ip := "192.168.1.1" + string(rune('2'+i))
		other := strings.NewReplacer(
			"node_id: pi-a ", "node_id: "+id+" ",
			"listen: 192.168.1.11:7946 ", "listen: "+ip+":7946 ",
			"/etc/peat/pi-a.", "/etc/peat/"+id+".",
		).Replace(data)
		oc, err := Parse([]byte(other))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if err := oc.Validate(); err != nil {
			t.Fatalf("%s is invalid: %v", id, err)
		}
		if oc.Cluster.NodeID != id || oc.Cluster.Listen != ip+":7946" || !strings.Contains(oc.Cluster.TLS.CertFile, id) {
			t.Fatalf("%s: cluster = %+v: the header's per-node lines did not all apply", id, oc.Cluster)
		}
		if !slices.Equal(oc.Cluster.Join, cfg.Cluster.Join) || !slices.Equal(oc.SiteConfig().Streams, wantStreams) {
			t.Fatalf("%s lists another site: join %v streams %v", id, oc.Cluster.Join, oc.SiteConfig().Streams)
		}
		if !slices.Contains(oc.Cluster.Join, oc.Cluster.Listen) {
			t.Fatalf("%s: its own address %s is not in the join list %v", id, oc.Cluster.Listen, oc.Cluster.Join)
		}
	}
}
