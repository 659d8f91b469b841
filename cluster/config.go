package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"
)

// Membership and controller timings (membership.go;
// measured in scripts/bench-results/cluster.md): a member has 1.5 s to
// refute a false suspicion. Wi-Fi, with its retransmits and power saving,
// needs Serf's defaults.
const (
	DefaultProbeInterval      = 500 * time.Millisecond
	DefaultProbeTimeout       = 250 * time.Millisecond
	DefaultSuspicionMult      = 3
	DefaultHeartbeatTimeout   = time.Second // raft's defaults
	DefaultElectionTimeout    = time.Second
	DefaultLeaderLeaseTimeout = 500 * time.Millisecond
	DefaultReconcileInterval  = 30 * time.Second
	DefaultApplyTimeout       = 5 * time.Second
	// DefaultSessionTimeout is cluster.session_timeout: a broker the
	// controller has not heard a heartbeat from for this long is fenced
	// (rules/session.go). Three Serf probe periods plus a suspicion: a
	// leader cut off from the controller alone is deposed about as fast
	// as a dead one.
	DefaultSessionTimeout    = 3 * time.Second
	DefaultHeartbeatInterval = 500 * time.Millisecond
	// DefaultReconnectInterval is how often Serf tries to rejoin a member
	// it has seen fail (Serf's own default is 30 s): a node is back
	// within a second or two of a healed link, not at the next 30 s tick.
	DefaultReconnectInterval = time.Second
)

// Config configures one node of a site.
type Config struct {
	// Site names the site; gossip carries it (memberlist's label) and a
	// member of another site is never heard. Empty: no label.
	Site     string
	NodeID   string   // unique in the site; Serf's node name and Raft's server id
	SerfAddr string   // gossip address, host:port (TCP and UDP); port 0 picks one
	RaftAddr string   // Raft's TCP address, host:port; port 0 picks one
	Join     []string // Serf addresses of members to join at start
	Voter    bool     // takes part in the controller's quorum; else follows its state as a non-voter

	// BootstrapExpect is how many voters the site starts with (1, 3 or 5).
	// A voter with no Raft state waits until it sees that many through
	// Serf, then all of them bootstrap the same configuration. 0: never
	// bootstrap (a node added to a running site, which the controller adds).
	BootstrapExpect int

	MQTTAddr string // advertised in the tags, for clients sent to another node

	// ClusterAddr is where this node's Server answers replication fetches
	// and controller commands, advertised in the tags; others reach it
	// with Dial. Empty: the node can neither take commands nor lead.
	ClusterAddr string
	Dial        Dialer // nil: TCPDialer

	// AcksLeader names the acks: leader streams: the controller leaves
	// moving their leadership off a leaving leader to that leader, for a
	// while (handOffLimit). nil: none. StartSite sets it.
	AcksLeader func(stream string) bool

	// RaftListener, when set, carries Raft instead of a TCP listener on
	// RaftAddr (which is then not used), and Raft dials with Dial: tests
	// run Raft over faultnet to partition a node from the controller.
	RaftListener net.Listener
	Version      string // Peat's version, advertised in the tags
	// noDedupTag, for this package's tests: the node does not advertise
	// tagDedup, as a node that predates it.
	noDedupTag bool

	SnapshotDir string // Raft's snapshots (raft's file snapshot store)

	// SerfSnapshot is Serf's snapshot file: the members this node knew,
	// which it rejoins after a restart even when no address of Join
	// answers. Empty: none kept.
	SerfSnapshot string

	ProbeInterval time.Duration // Serf failure detection, see DefaultProbeInterval
	ProbeTimeout  time.Duration
	SuspicionMult int

	HeartbeatTimeout   time.Duration // Raft
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration

	// ReconcileInterval is how often the controller compares Serf's members
	// with its state, beside reacting to each member event.
	ReconcileInterval time.Duration
	ApplyTimeout      time.Duration // a controller command's deadline

	// SessionTimeout: the controller fences a broker it has not heard a
	// heartbeat from for this long, whatever Serf says; a leader stops
	// committing a quarter of it sooner (rules/session.go).
	// HeartbeatInterval is how often every broker heartbeats.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	// ReconnectInterval is how often Serf tries to rejoin failed members.
	ReconnectInterval time.Duration

	// ReplaceAfter is how long a member may stay failed before the
	// controller removes it from the site as RemoveBroker does (its
	// replicas move to other brokers, a voter leaves Raft). 0: never; an
	// operator removes a node that is gone for good (Site.RemoveNode).
	// The count starts again with every new controller.
	ReplaceAfter time.Duration

	Logger *slog.Logger // nil = discard; Serf's and Raft's logs are bridged into it

	// KeyringFile is Serf's keyring (keyring.go): gossip is encrypted with
	// its first key and accepted under any of them; key changes made
	// through InstallKey, UseKey and RemoveKey are written back to it.
	// Empty: gossip in the clear.
	KeyringFile string
	// TLS, when set, puts Raft and the cluster transport under mutual TLS
	// with the site's CA (tls.go). Nil: plain TCP.
	TLS *TLSConfig
}

// DefaultConfig is a voter with the default timings; NodeID, the addresses
// and SnapshotDir are the caller's.
func DefaultConfig() Config {
	return Config{
		Voter:              true,
		ProbeInterval:      DefaultProbeInterval,
		ProbeTimeout:       DefaultProbeTimeout,
		SuspicionMult:      DefaultSuspicionMult,
		HeartbeatTimeout:   DefaultHeartbeatTimeout,
		ElectionTimeout:    DefaultElectionTimeout,
		LeaderLeaseTimeout: DefaultLeaderLeaseTimeout,
		ReconcileInterval:  DefaultReconcileInterval,
		ApplyTimeout:       DefaultApplyTimeout,
		SessionTimeout:     DefaultSessionTimeout,
		HeartbeatInterval:  DefaultHeartbeatInterval,
		ReconnectInterval:  DefaultReconnectInterval,
	}
}

// Validate reports every problem, each naming its field.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("cluster: %s: "+format, append([]any{field}, args...)...))
	}
	if c.NodeID == "" {
		bad("NodeID", "empty")
	}
	if len(c.Site) > 255 { // memberlist's limit on a label
		bad("Site", "%d bytes, more than 255", len(c.Site))
	}
	for _, a := range []struct{ field, addr string }{{"SerfAddr", c.SerfAddr}, {"RaftAddr", c.RaftAddr}} {
		if a.field == "RaftAddr" && c.RaftListener != nil {
			continue
		}
		if err := checkAddr(a.addr); err != nil {
			bad(a.field, "%v", err)
		}
	}
	if c.ClusterAddr != "" && c.Dial == nil {
		if err := checkAddr(c.ClusterAddr); err != nil {
			bad("ClusterAddr", "%v", err) // dialled over TCP by the others
		}
	}
	switch {
	case c.BootstrapExpect < 0:
		bad("BootstrapExpect", "%d is negative", c.BootstrapExpect)
	case c.BootstrapExpect > 0 && !c.Voter:
		bad("BootstrapExpect", "only a voter bootstraps the controller")
	}
	if c.SnapshotDir == "" {
		bad("SnapshotDir", "empty")
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"ProbeInterval", c.ProbeInterval}, {"ProbeTimeout", c.ProbeTimeout},
		{"HeartbeatTimeout", c.HeartbeatTimeout}, {"ElectionTimeout", c.ElectionTimeout},
		{"LeaderLeaseTimeout", c.LeaderLeaseTimeout}, {"ReconcileInterval", c.ReconcileInterval},
		{"ApplyTimeout", c.ApplyTimeout}, {"SessionTimeout", c.SessionTimeout},
		{"HeartbeatInterval", c.HeartbeatInterval}, {"ReconnectInterval", c.ReconnectInterval}} {
		if d.v <= 0 {
			bad(d.field, "%v is not positive", d.v)
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval && c.ProbeInterval > 0 {
		bad("ProbeTimeout", "%v must be shorter than ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.ReplaceAfter < 0 {
		bad("ReplaceAfter", "%v is negative", c.ReplaceAfter)
	}
	if c.SuspicionMult < 1 {
		bad("SuspicionMult", "%d is below 1", c.SuspicionMult)
	}
	if c.HeartbeatInterval > 0 && c.SessionTimeout < 3*c.HeartbeatInterval {
		// A session must outlast a lost heartbeat or two.
		bad("SessionTimeout", "%v is shorter than three HeartbeatIntervals (%v)", c.SessionTimeout, c.HeartbeatInterval)
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		bad("LeaderLeaseTimeout", "%v is longer than HeartbeatTimeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	return errors.Join(errs...)
}

// checkAddr accepts host:port with a specific IP: the address goes into
// the tags that other members dial.
func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		return fmt.Errorf("%q: need a specific IP address that other members can dial", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q: bad port", addr)
	}
	return nil
}
