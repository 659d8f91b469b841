package edge

import (
	"strings"
	"testing"
)

// Every address a site node listens on is held to cluster.listen's rule:
// one on the network needs keyring_file and tls, or allow_plaintext.
func TestClusterConfig_EveryListenerFailsSafe(t *testing.T) {
	const lan = "192.168.1.10"
	for _, tc := range []struct {
		name string
		edit func(*ClusterConfig)
		want []string // fields the error names; none: valid
	}{
		{"raft_listen on the LAN", func(c *ClusterConfig) { c.RaftListen = lan + ":7947" }, []string{"cluster.raft_listen"}},
		{"transport_listen on the LAN", func(c *ClusterConfig) { c.TransportListen = lan + ":7948" }, []string{"cluster.transport_listen"}},
		{"all three on the LAN", func(c *ClusterConfig) { c.Listen = lan + ":7946" },
			[]string{"cluster.listen", "cluster.raft_listen", "cluster.transport_listen"}},
		{"raft_listen on the LAN, opted out", func(c *ClusterConfig) {
			c.RaftListen, c.AllowPlaintext = lan+":7947", true
		}, nil},
		{"raft_listen on the LAN, encrypted", func(c *ClusterConfig) {
			c.RaftListen, c.KeyringFile = lan+":7947", "keyring"
			c.TLS = ClusterTLSConfig{CAFile: "ca", CertFile: "c", KeyFile: "k"}
		}, nil},
		{"all on loopback", func(c *ClusterConfig) { c.RaftListen, c.TransportListen = "127.0.0.1:7947", "[::1]:7948" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := siteConfig(t, "n1", 1)
			cfg.Cluster.Listen = "127.0.0.1:7946"
			tc.edit(&cfg.Cluster)
			n, err := New(cfg, nil) // New validates: such a node never starts
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				n.Close(t.Context())
				t.Fatal("New accepted it")
			}
			for _, f := range tc.want {
				if !strings.Contains(err.Error(), f+": ") || !strings.Contains(err.Error(), "cluster.allow_plaintext") {
					t.Errorf("error %q does not refuse %s naming cluster.allow_plaintext", err, f)
				}
			}
		})
	}
}
