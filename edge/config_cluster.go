package edge

import (
	"cmp"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/peatmq/peat/cluster"
)

// ClusterConfig makes the node a member of a site (package cluster). It
// is off while node_id is empty.
type ClusterConfig struct {
	// Name is the site's name: gossip of another site is not heard.
	Name   string `yaml:"name"`
	NodeID string `yaml:"node_id"`
	// Listen is Serf's gossip address (TCP and UDP) with the IP the other
	// nodes reach this one at. RaftListen and TransportListen default to
	// the same IP with the next two ports.
	Listen          string   `yaml:"listen"`
	RaftListen      string   `yaml:"raft_listen"`
	TransportListen string   `yaml:"transport_listen"`
	Join            []string `yaml:"join"`
	// Voter: takes part in the controller's quorum (1, 3 or 5 per site).
	Voter bool `yaml:"voter"`
	// Expect is how many voters the site starts with; every first-start
	// voter waits for that many, then they bootstrap the controller. 0: a
	// node added to a running site.
	Expect int `yaml:"expect"`

	ReplicationFactor int      `yaml:"replication_factor"`
	MinInsyncReplicas int      `yaml:"min_insync_replicas"`
	ReplicaLagMax     Duration `yaml:"replica_lag_max"`
	// Acks is when a publish is acknowledged: all (the in-sync replicas
	// hold it) or leader (the leader wrote it).
	Acks string `yaml:"acks"`
	// ReplaceAfter is how long a member may stay failed before the
	// controller removes it and moves its replicas to other brokers
	// (cluster.Config.ReplaceAfter); 0: never (peat cluster remove-node).
	ReplaceAfter Duration `yaml:"replace_after"`
	// LeaderBalanceAfter: a stream's preferred leader (its first replica)
	// back alive and in sync this long leads it again
	// (cluster.SiteConfig.LeaderBalanceAfter); 0: never.
	LeaderBalanceAfter Duration `yaml:"leader_balance_after"`

	// Failure detection (Serf): see configs/peat.yaml for Wi-Fi.
	ProbeInterval Duration `yaml:"probe_interval"`
	ProbeTimeout  Duration `yaml:"probe_timeout"`
	SuspicionMult int      `yaml:"suspicion_mult"`
	// SessionTimeout: the controller fences a broker whose heartbeats
	// stopped this long, whatever Serf says (cluster.Config).
	SessionTimeout Duration `yaml:"session_timeout"`
	// ReconnectInterval is how often Serf tries to rejoin a failed member.
	ReconnectInterval Duration `yaml:"reconnect_interval"`

	KeyringFile string           `yaml:"keyring_file"`
	TLS         ClusterTLSConfig `yaml:"tls"`
	// AllowPlaintext lets a node whose listen, raft_listen or
	// transport_listen is a non-loopback address run without
	// keyring_file and tls.
	AllowPlaintext bool `yaml:"allow_plaintext"`
}

// ClusterTLSConfig is the site's mutual TLS (cluster.TLSConfig).
type ClusterTLSConfig struct {
	CAFile       string `yaml:"ca_file"`
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	VerifyNodeID bool   `yaml:"verify_node_id"`
}

func defaultCluster() ClusterConfig {
	d := cluster.DefaultConfig()
	return ClusterConfig{
		Voter:         true,
		Join:          []string{},
		Acks:          AcksAll,
		ReplicaLagMax: Duration(cluster.DefaultReplicaLagMax),
		// Kafka's leader.imbalance.check.interval.seconds.
		LeaderBalanceAfter: Duration(5 * time.Minute),
		ProbeInterval:      Duration(d.ProbeInterval),
		ProbeTimeout:       Duration(d.ProbeTimeout),
		SuspicionMult:      d.SuspicionMult,
		SessionTimeout:     Duration(d.SessionTimeout),
		ReconnectInterval:  Duration(d.ReconnectInterval),
	}
}

// minReplaceAfter is the shortest cluster.replace_after: a node failed
// for less is rebooting or unplugged, not gone.
const minReplaceAfter = 10 * time.Minute

// minLeaderBalanceAfter is the shortest cluster.leader_balance_after: a
// node must stay in sync a while before leaderships move back to it, or
// a flapping node would take them back and forth.
const minLeaderBalanceAfter = 10 * time.Second

// The values of cluster.acks and streams[].acks.
const (
	AcksAll    = "all"
	AcksLeader = "leader"
)

// Enabled reports whether the node runs in a site.
func (c ClusterConfig) Enabled() bool { return c.NodeID != "" }

// nextPort is addr's host with its port plus k; port 0 stays 0 (tests).
func nextPort(addr string, k int) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return ""
	}
	if p != 0 {
		p += k
	}
	return net.JoinHostPort(host, strconv.Itoa(p))
}

func (c ClusterConfig) raftListen() string {
	if c.RaftListen != "" {
		return c.RaftListen
	}
	return nextPort(c.Listen, 1)
}

func (c ClusterConfig) transportListen() string {
	if c.TransportListen != "" {
		return c.TransportListen
	}
	return nextPort(c.Listen, 2)
}

// secured reports whether the site's traffic is encrypted: gossip by the
// keyring, Raft and replication by TLS.
func (c ClusterConfig) secured() bool { return c.KeyringFile != "" && c.TLS.CertFile != "" }

// validateCluster checks the cluster section, and what a site rules out.
func (c Config) validateCluster(add func(path, format string, args ...any)) {
	cc := c.Cluster
	c.validateStreamReplication(add)
	if !cc.Enabled() {
		if cc.Listen != "" || len(cc.Join) > 0 {
			add("cluster.node_id", "must be set when cluster.listen or cluster.join is (it turns the cluster on)")
		}
		return
	}
	addrs := []struct{ path, addr string }{
		{"cluster.listen", cc.Listen}, {"cluster.raft_listen", cc.raftListen()}, {"cluster.transport_listen", cc.transportListen()},
	}
	seen := map[string]string{}
	for _, a := range addrs {
		if msg := checkSiteAddr(a.addr); msg != "" {
			add(a.path, "%s", msg)
			continue
		}
		if _, port, _ := net.SplitHostPort(a.addr); port != "0" {
			if other, dup := seen[a.addr]; dup {
				add(a.path, "%s is also %s", a.addr, other)
			}
			seen[a.addr] = a.path
		}
	}
	for i, j := range cc.Join {
		if msg := checkHostPort(j); msg != "" {
			add("cluster.join["+strconv.Itoa(i)+"]", "%s", msg)
		}
	}
	switch {
	case cc.Expect < 0:
		add("cluster.expect", "must not be negative, got %d", cc.Expect)
	case cc.Expect > 0 && !cc.Voter:
		add("cluster.expect", "only a voter bootstraps the controller; set voter: true or expect: 0")
	case cc.Expect > 0 && cc.Expect%2 == 0:
		add("cluster.expect", "%d voters tolerate no more failures than %d; use 1, 3 or 5", cc.Expect, cc.Expect-1)
	}
	if cc.ReplicationFactor < 0 || cc.ReplicationFactor > 5 {
		add("cluster.replication_factor", "must be 1 to 5, or 0 for the voters up to 3, got %d", cc.ReplicationFactor)
	}
	if cc.MinInsyncReplicas < 0 {
		add("cluster.min_insync_replicas", "must not be negative, got %d", cc.MinInsyncReplicas)
	} else if cc.ReplicationFactor > 0 && cc.MinInsyncReplicas > cc.ReplicationFactor {
		add("cluster.min_insync_replicas", "%d is above replication_factor %d: every publish would be refused",
			cc.MinInsyncReplicas, cc.ReplicationFactor)
	}
	if cc.Acks != AcksAll && cc.Acks != AcksLeader {
		add("cluster.acks", "must be all or leader, got %q", cc.Acks)
	}
	if cc.ReplicaLagMax <= 0 {
		add("cluster.replica_lag_max", "must be positive")
	}
	if ra := time.Duration(cc.ReplaceAfter); ra != 0 && ra < minReplaceAfter {
		add("cluster.replace_after", "%v would copy whole streams again after a reboot or a pulled cable; "+
			"use 0 (never: peat cluster remove-node) or at least %v", ra, minReplaceAfter)
	}
	if lb := time.Duration(cc.LeaderBalanceAfter); lb != 0 && lb < minLeaderBalanceAfter {
		add("cluster.leader_balance_after", "%v: use 0 (never move leaders back) or at least %v, so that a node "+
			"proves itself in sync before it leads again", lb, minLeaderBalanceAfter)
	}
	if cc.ProbeInterval <= 0 {
		add("cluster.probe_interval", "must be positive")
	}
	if st := time.Duration(cc.SessionTimeout); st < 3*cluster.DefaultHeartbeatInterval {
		add("cluster.session_timeout", "%v: use at least %v (three heartbeats), a few seconds on a LAN", st, 3*cluster.DefaultHeartbeatInterval)
	}
	if cc.ReconnectInterval <= 0 {
		add("cluster.reconnect_interval", "must be positive")
	}
	if cc.ProbeTimeout <= 0 || cc.ProbeTimeout >= cc.ProbeInterval {
		add("cluster.probe_timeout", "must be positive and shorter than probe_interval")
	}
	if cc.SuspicionMult < 1 {
		add("cluster.suspicion_mult", "must be at least 1, got %d", cc.SuspicionMult)
	}
	if len(cc.Name) > 255 {
		add("cluster.name", "at most 255 bytes")
	}
	t := cc.TLS
	if (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "") && (t.CAFile == "" || t.CertFile == "" || t.KeyFile == "") {
		add("cluster.tls", "ca_file, cert_file and key_file go together")
	}
	// Gossip, Raft and replication each carry the site's data: any one
	// on the network in the clear is enough to read or forge it.
	for _, a := range addrs {
		if !cc.AllowPlaintext && !cc.secured() && checkSiteAddr(a.addr) == "" && !loopback(a.addr) {
			add(a.path, "%s is reachable from the network, and the site's traffic would be in the clear: "+
				"set cluster.keyring_file and cluster.tls, or cluster.allow_plaintext: true", a.addr)
		}
	}
}

// validateStreamReplication checks the streams' cluster fields, which
// mean nothing on a single node.
func (c Config) validateStreamReplication(add func(path, format string, args ...any)) {
	for i, s := range c.Streams {
		p := "streams[" + strconv.Itoa(i) + "]."
		set := s.ReplicationFactor != 0 || s.MinInsyncReplicas != 0 || s.UncleanLeaderElection || s.Acks != ""
		if !c.Cluster.Enabled() {
			if set {
				add(p+"replication_factor", "replication settings need a cluster (cluster.node_id)")
			}
			continue
		}
		if s.Name == cluster.SessionsStream {
			add(p+"name", "%q is reserved in a cluster for the site's durable sessions", s.Name)
		}
		if s.Acks != "" && s.Acks != AcksAll && s.Acks != AcksLeader {
			add(p+"acks", "must be all or leader, got %q", s.Acks)
		}
		// A mirror's sender moves on past what was acknowledged: a record
		// acknowledged and then lost in a failover would leave a hole
		// that the mirror refuses every later record over, for good.
		if s.Mirror && cmp.Or(s.Acks, c.Cluster.Acks) == AcksLeader {
			add(p+"acks", "a mirror stream needs acks: all (acks: leader may lose acknowledged records in a failover, "+
				"and the mirror would then refuse every record after the hole)")
		}
		if s.Mirror && s.UncleanLeaderElection {
			add(p+"unclean_leader_election", "a mirror stream cannot have it: an unclean election loses committed records, "+
				"and the mirror would then refuse every record after the hole")
		}
		if s.ReplicationFactor < 0 || s.ReplicationFactor > 5 {
			add(p+"replication_factor", "must be 1 to 5, or 0 for cluster.replication_factor, got %d", s.ReplicationFactor)
		}
		rf := cmp.Or(s.ReplicationFactor, c.Cluster.ReplicationFactor)
		switch minISR := cmp.Or(s.MinInsyncReplicas, c.Cluster.MinInsyncReplicas); {
		case s.MinInsyncReplicas < 0:
			add(p+"min_insync_replicas", "must not be negative, got %d", s.MinInsyncReplicas)
		case rf > 0 && minISR > rf:
			add(p+"min_insync_replicas", "%d is above the replication factor %d: every publish would be refused", minISR, rf)
		}
	}
}

// checkSiteAddr accepts host:port with a specific IP, which other nodes dial.
func checkSiteAddr(addr string) string {
	if msg := checkHostPort(addr); msg != "" {
		return msg
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return "needs the IP address other nodes reach this one at (not a host name or 0.0.0.0), got " + addr
	}
	return ""
}

// SiteConfig is the cluster configuration this Config describes (Store,
// Logger and MQTTAddr are left for the caller).
func (c Config) SiteConfig() cluster.SiteConfig {
	cc := c.Cluster
	nc := cluster.DefaultConfig()
	nc.Site = cc.Name
	nc.NodeID = cc.NodeID
	nc.SerfAddr = cc.Listen
	nc.RaftAddr = cc.raftListen()
	nc.Join = append([]string(nil), cc.Join...)
	nc.Voter = cc.Voter
	nc.BootstrapExpect = cc.Expect
	nc.SnapshotDir = filepath.Join(c.DataDir, "raft-snapshots")
	nc.SerfSnapshot = filepath.Join(c.DataDir, "serf.snapshot")
	nc.ProbeInterval = time.Duration(cc.ProbeInterval)
	nc.ProbeTimeout = time.Duration(cc.ProbeTimeout)
	nc.SuspicionMult = cc.SuspicionMult
	nc.SessionTimeout = time.Duration(cc.SessionTimeout)
	nc.ReconnectInterval = time.Duration(cc.ReconnectInterval)
	nc.ReplaceAfter = time.Duration(cc.ReplaceAfter)
	nc.KeyringFile = cc.KeyringFile
	if cc.TLS.CertFile != "" {
		nc.TLS = &cluster.TLSConfig{CAFile: cc.TLS.CAFile, CertFile: cc.TLS.CertFile, KeyFile: cc.TLS.KeyFile,
			VerifyNodeID: cc.TLS.VerifyNodeID}
	}
	sc := cluster.SiteConfig{
		Node:              nc,
		TransportListen:   cc.transportListen(),
		ReplicationFactor: cc.ReplicationFactor,
		MinInsyncReplicas: cc.MinInsyncReplicas,
		LagMax:            time.Duration(cc.ReplicaLagMax),

		LeaderBalanceAfter: time.Duration(cc.LeaderBalanceAfter),
	}
	for _, s := range c.Streams {
		sc.Streams = append(sc.Streams, cluster.SiteStream{Name: s.Name, ReplicationFactor: s.ReplicationFactor,
			MinInsyncReplicas: s.MinInsyncReplicas, UncleanElection: s.UncleanLeaderElection,
			AcksLeader: cmp.Or(s.Acks, cc.Acks) == AcksLeader})
	}
	return sc
}
