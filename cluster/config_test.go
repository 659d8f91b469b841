package cluster

import (
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	c := DefaultConfig()
	c.NodeID, c.SerfAddr, c.RaftAddr, c.SnapshotDir = "n1", "10.0.0.1:7946", "10.0.0.1:7947", "/data/raft"
	c.BootstrapExpect = 3
	c.ClusterAddr = "10.0.0.1:7948"
	return c
}

func TestConfig_Validate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want []string
	}{
		{"no node id", func(c *Config) { c.NodeID = "" }, []string{"NodeID: empty"}},
		{"unspecified address", func(c *Config) { c.SerfAddr = "0.0.0.0:7946" }, []string{"SerfAddr:", "specific IP"}},
		{"a host name", func(c *Config) { c.RaftAddr = "pi1:7947" }, []string{"RaftAddr:"}},
		{"no port", func(c *Config) { c.RaftAddr = "10.0.0.1" }, []string{"RaftAddr:"}},
		{"cluster address unspecified", func(c *Config) { c.ClusterAddr = "0.0.0.0:7948" }, []string{"ClusterAddr:", "specific IP"}},
		{"a non-voter bootstraps", func(c *Config) { c.Voter = false }, []string{"BootstrapExpect: only a voter"}},
		{"negative expect", func(c *Config) { c.BootstrapExpect = -1 }, []string{"BootstrapExpect: -1"}},
		{"probe timeout not below the interval", func(c *Config) { c.ProbeTimeout = c.ProbeInterval }, []string{"ProbeTimeout:"}},
		{"zero timings", func(c *Config) { c.ProbeInterval, c.ElectionTimeout = 0, 0 }, []string{"ProbeInterval: 0s", "ElectionTimeout: 0s"}},
		{"suspicion", func(c *Config) { c.SuspicionMult = 0 }, []string{"SuspicionMult: 0"}},
		{"lease past heartbeat", func(c *Config) { c.LeaderLeaseTimeout = 2 * time.Second }, []string{"LeaderLeaseTimeout:"}},
		{"every problem at once", func(c *Config) { c.NodeID, c.SnapshotDir = "", "" }, []string{"NodeID", "SnapshotDir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %q, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestBrokerEpoch_GrowsOnEveryStart(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	now := time.UnixMilli(1_000_000)
	e1, err := nextBrokerEpoch(st, now)
	if err != nil || e1 != 1_000_000 {
		t.Fatalf("first epoch = %d, %v; want the time in ms", e1, err)
	}
	// The clock went back: the epoch still grows.
	e2, err := nextBrokerEpoch(st, now.Add(-time.Hour))
	if err != nil || e2 != e1+1 {
		t.Fatalf("epoch after the clock went back = %d, %v; want %d", e2, err, e1+1)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openStore(t, dir)
	if e3, err := nextBrokerEpoch(st, now); err != nil || e3 != e2+1 {
		t.Fatalf("epoch after reopen = %d, %v; want %d", e3, err, e2+1)
	}
	// A new disk: the time keeps it above the old incarnation's.
	if e, err := nextBrokerEpoch(openStore(t, ""), now.Add(time.Minute)); err != nil || e <= e2 {
		t.Fatalf("epoch on a new disk = %d, %v; want above %d", e, err, e2)
	}
}
