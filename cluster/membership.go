package cluster

import (
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
)

// Membership.
//
// Every node runs Serf. Its tags carry the node's role (voter or broker),
// MQTT address, Raft address, Peat version and broker epoch. The broker
// epoch is new on every start (the stored one plus 1, at least the time in
// milliseconds, so a node whose disk was replaced still outranks its old
// incarnation): a restarted replica cannot rejoin an ISR on its old
// standing. One goroutine drains Serf's event channel (a blocked channel
// stalls Serf) and only nudges the controller loop.
//
// Failure detection is memberlist's: a probe every ProbeInterval, answered
// within ProbeTimeout, then a suspicion of SuspicionMult intervals that
// the other members' confirmations shorten to its minimum. The defaults,
// 500 ms, 250 ms and 3, leave a live node 1.5 s to refute a false
// suspicion and fail a stream over well under 5 s (measured in
// scripts/bench-results/cluster.md). Serf's LAN defaults (1 s, 500 ms,
// 4) detect a failure in about 5 s; 200 ms, 100 ms, 2 in under 1 s, but
// leave ~400 ms to refute. On Wi-Fi, whose retransmits and power saving
// delay acks by hundreds of milliseconds, use Serf's defaults.

// Serf tags of a member (at most 512 bytes in all, Serf's limit).
const (
	tagRole    = "role"  // roleVoter or roleBroker
	tagMQTT    = "mqtt"  // MQTT address for clients
	tagRaft    = "raft"  // Raft's address
	tagVersion = "ver"   // Peat's version
	tagEpoch   = "epoch" // broker epoch, decimal; new on every start
	tagCluster = "cl"    // the replication and command address (Server)

	roleVoter  = "voter"
	roleBroker = "broker"
)

// Member is a node as Serf sees it.
type Member struct {
	ID       string
	Status   string // alive, leaving, left, failed
	Voter    bool
	MQTTAddr string
	RaftAddr string
	// ClusterAddr is where its Server answers fetches and commands.
	ClusterAddr string
	Version     string
	Epoch       uint64 // 0 when the tag is missing or bad
	Tags        map[string]string
}

func memberOf(m serf.Member) Member {
	e, _ := strconv.ParseUint(m.Tags[tagEpoch], 10, 64)
	return Member{
		ID: m.Name, Status: m.Status.String(), Voter: m.Tags[tagRole] == roleVoter,
		MQTTAddr: m.Tags[tagMQTT], RaftAddr: m.Tags[tagRaft], ClusterAddr: m.Tags[tagCluster], Version: m.Tags[tagVersion],
		Epoch: e, Tags: m.Tags,
	}
}

func (n *Node) tags() map[string]string {
	role := roleBroker
	if n.cfg.Voter {
		role = roleVoter
	}
	t := map[string]string{
		tagRole:  role,
		tagRaft:  n.RaftAddr(),
		tagEpoch: strconv.FormatUint(n.epoch, 10),
	}
	if n.cfg.ClusterAddr != "" {
		t[tagHeartbeat] = "1" // it sends and counts heartbeats (heartbeat.go)
		if !n.cfg.noDedupTag {
			t[tagDedup] = "1" // its leaders remember forwards (forward_dedup.go)
		}
	}
	if n.cfg.MQTTAddr != "" {
		t[tagMQTT] = n.cfg.MQTTAddr
	}
	if n.cfg.Version != "" {
		t[tagVersion] = n.cfg.Version
	}
	if n.cfg.ClusterAddr != "" {
		t[tagCluster] = n.cfg.ClusterAddr
	}
	return t
}

func (n *Node) startSerf() error {
	host, port, _ := net.SplitHostPort(n.cfg.SerfAddr) // Validate checked it
	p, _ := strconv.Atoi(port)
	logger := log.New(logWriter{n.log.With(slog.String("component", "serf"))}, "", 0)

	ml := memberlist.DefaultLANConfig()
	ml.BindAddr, ml.BindPort = host, p
	ml.AdvertiseAddr, ml.AdvertisePort = "", 0 // the bound address (port 0: the one picked)
	ml.ProbeInterval = n.cfg.ProbeInterval
	ml.ProbeTimeout = n.cfg.ProbeTimeout
	ml.SuspicionMult = n.cfg.SuspicionMult
	// memberlist's TCP connections (joins, Serf's reconnects, push-pull)
	// wait 10 s by default; one started just before a heal then holds the
	// rejoin that long. Four probe intervals: 2 s on a wired LAN.
	ml.TCPTimeout = max(4*n.cfg.ProbeInterval, 2*time.Second)
	ml.Logger = logger
	ml.Label = n.cfg.Site  // packets of another site are dropped unread
	ml.Keyring = n.keyring // with GossipVerifyIncoming (the default): no clear-text gossip accepted

	sc := serf.DefaultConfig()
	sc.NodeName = n.cfg.NodeID
	sc.Tags = n.tags()
	sc.EventCh = n.events
	sc.MemberlistConfig = ml
	sc.Logger = logger
	sc.KeyringFile = n.cfg.KeyringFile // Serf rewrites it on every key change
	sc.SnapshotPath = n.cfg.SerfSnapshot
	sc.ReconnectInterval = n.cfg.ReconnectInterval
	s, err := serf.Create(sc)
	if err != nil {
		return fmt.Errorf("cluster: start serf on %s: %w", n.cfg.SerfAddr, err)
	}
	n.serf = s
	return nil
}

// eventLoop drains Serf's events: a blocked EventCh stalls Serf, so it
// only records and nudges; the controller loop does the work.
func (n *Node) eventLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case ev := <-n.events:
			me, ok := ev.(serf.MemberEvent)
			if !ok {
				continue // user events and queries: none are used
			}
			for _, m := range me.Members {
				n.log.Info("cluster: member "+me.Type.String(), slog.String("member", m.Name),
					slog.String("status", m.Status.String()))
				if me.Type == serf.EventMemberReap && m.Tags[tagRole] == roleVoter {
					n.mu.Lock()
					n.mu.reaped[m.Name] = true
					n.mu.Unlock()
				}
			}
			if me.Type == serf.EventMemberJoin {
				n.maybeBootstrap()
			}
			n.nudge()
		}
	}
}

// maybeBootstrap bootstraps Raft once BootstrapExpect voters are alive,
// on a voter that has no Raft state. Every such voter builds the same
// configuration (all alive voters, in id order), so their bootstraps
// agree.
func (n *Node) maybeBootstrap() {
	if n.cfg.BootstrapExpect == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.mu.bootstrapped {
		return
	}
	var servers []raft.Server
	for _, m := range n.serf.Members() {
		if m.Status != serf.StatusAlive || m.Tags[tagRole] != roleVoter || m.Tags[tagRaft] == "" {
			continue
		}
		servers = append(servers, raft.Server{
			Suffrage: raft.Voter, ID: raft.ServerID(m.Name), Address: raft.ServerAddress(m.Tags[tagRaft]),
		})
	}
	if len(servers) < n.cfg.BootstrapExpect {
		return
	}
	slices.SortFunc(servers, func(a, b raft.Server) int {
		return cmpString(string(a.ID), string(b.ID))
	})
	n.mu.bootstrapped = true
	err := n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if err != nil && err != raft.ErrCantBootstrap {
		n.log.Error("cluster: bootstrap", slog.Any("err", err))
		return
	}
	n.log.Info("cluster: bootstrapped the controller quorum", slog.Int("voters", len(servers)))
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
