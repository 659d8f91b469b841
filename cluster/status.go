package cluster

import (
	"fmt"
	"slices"
	"strings"

	"github.com/peatmq/peat/cluster/rules"
)

// The operator's view (here, metrics.go, leader_status.go).
//
// Site.Status is one node's view, made on request: its id, broker epoch,
// role, the controller it knows and Raft's voters and non-voters; Serf's
// members with their state and tags; per stream the controller's state
// (leader, leader epoch, version, replicas, ISR, under-replicated when the
// ISR is smaller than the replicas), this node's replica's high
// watermark and log end, and, on the node leading it, each replica's log
// end and lag in records as the Leader last heard them (Leader.Positions,
// under the Leader's lock; a replica that has not fetched from this
// leader counts as 0, as the watermark counts it). GET /api/v1/cluster
// serves it.
//
// CaughtUp (/readyz) is false while no controller is known or this node
// is cut off from it (Node.CutOff), while the
// controller has not registered this run's broker epoch (a restarted node
// whose state still shows its old standing), or while the node is a
// replica of a stream outside its ISR; the reason names which.
//
// Collector reads Status at scrape time, so a series goes with its
// stream or replica and nothing is counted twice:
// peat_cluster_members{state}, peat_cluster_is_controller,
// peat_cluster_caught_up, peat_stream_isr_size, peat_stream_replicas,
// peat_stream_under_replicated, peat_replica_lag_records{stream,replica}
// (on the leader only), peat_cluster_leader_elections_total{stream} (the
// stream's leader epoch: every change of leader since its creation, as
// the agreed state counts them, the same on every node and across
// restarts) and peat_cluster_controller_changes_total. The last is this
// node's own count: StartSite registers a raft observer of leader
// changes and counts each new (controller, Raft term), so a follower
// that loses the leader for a heartbeat and hears it again in the same
// term counts nothing; it starts at the first controller this run knows.

// SiteStatus is one node's view of its site, for operators: who is a
// member, who is controller, and how each stream's replicas stand. It is
// what GET /api/v1/cluster answers, and what the metrics read.
type SiteStatus struct {
	NodeID       string   `json:"node_id"`
	Site         string   `json:"site"`
	BrokerEpoch  uint64   `json:"broker_epoch"`
	Voter        bool     `json:"voter"`
	IsController bool     `json:"is_controller"`
	Controller   string   `json:"controller"` // "" while this node knows of none
	Voters       []string `json:"voters"`     // Raft's configuration as this node knows it
	NonVoters    []string `json:"non_voters"`
	// Ready is CaughtUp: NotReady says why not.
	Ready    bool           `json:"ready"`
	NotReady string         `json:"not_ready,omitempty"`
	Members  []MemberStatus `json:"members"`
	Streams  []StreamStatus `json:"streams"`
	// ControllerChanges counts the controllers this node learned of
	// since it started (see ControllerChanges).
	ControllerChanges uint64 `json:"controller_changes"`
}

// MemberStatus is a member as Serf sees it, with its tags.
type MemberStatus struct {
	ID          string `json:"id"`
	State       string `json:"state"` // alive, leaving, left, failed
	Role        string `json:"role"`  // voter or broker
	MQTTAddr    string `json:"mqtt_addr,omitempty"`
	ClusterAddr string `json:"cluster_addr,omitempty"`
	Version     string `json:"version,omitempty"`
	BrokerEpoch uint64 `json:"broker_epoch"`
	// Removal is a decommission's progress (RemoveNode): "draining"
	// while streams still have a replica on it (Holds names them),
	// "drained" once none has (stop it: the controller then removes
	// it), "removed" for a member gone for good; "" for the others.
	Removal string   `json:"removal,omitempty"`
	Holds   []string `json:"holds,omitempty"`
}

// StreamStatus is a stream's replication state as the controller agreed
// it, with this node's replica and, on its leader, the followers' places.
type StreamStatus struct {
	Name        string   `json:"name"`
	Leader      string   `json:"leader"` // "" while offline
	LeaderEpoch uint32   `json:"leader_epoch"`
	Version     uint64   `json:"version"`
	Replicas    []string `json:"replicas"`
	ISR         []string `json:"isr"`
	// ReplicationFactor is how many replicas the stream should have: it
	// has fewer while the site lacks brokers, more while a replica moves.
	ReplicationFactor int `json:"replication_factor"`
	// UnderReplicated: the ISR is smaller than the replica set, or the
	// replica set than the replication factor.
	UnderReplicated bool `json:"under_replicated"`
	// HighWatermark and LogEnd are this node's replica's (committed
	// records are below the watermark); both 0 without a local replica.
	LocalReplica  bool   `json:"local_replica"`
	HighWatermark uint64 `json:"high_watermark"`
	LogEnd        uint64 `json:"log_end"`
	// ReplicaLag is filled on the node leading the stream only.
	ReplicaLag []ReplicaLag `json:"replica_lag,omitempty"`
	// Moving are the replicas a rebalance is moving (Stream.Moves).
	Moving []rules.ReplicaMove `json:"moving,omitempty"`
}

// ReplicaLag is one replica's place as its leader sees it.
type ReplicaLag struct {
	ID    string `json:"id"`
	InISR bool   `json:"in_isr"`
	// Fetched is false until the replica has fetched from this leader
	// (in its current broker epoch): LogEnd is then unknown, counted as 0.
	Fetched    bool   `json:"fetched"`
	LogEnd     uint64 `json:"log_end"`
	LagRecords uint64 `json:"lag_records"` // the leader's log end minus LogEnd
}

// Status is this node's view of the site now. It reads the Raft state
// this node has applied, Serf's members and the Leaders it runs, and
// takes no lock of the controller's.
func (s *Site) Status() SiteStatus {
	n := s.Node
	st, _ := n.State()
	out := SiteStatus{
		NodeID: n.ID(), Site: n.cfg.Site, BrokerEpoch: n.Epoch(), Voter: n.cfg.Voter,
		IsController: n.IsController(), Controller: n.Controller(),
		Voters: []string{}, NonVoters: []string{}, Members: []MemberStatus{}, Streams: []StreamStatus{},
		ControllerChanges: s.ControllerChanges(),
	}
	if v, nv, err := n.Quorum(); err == nil {
		out.Voters, out.NonVoters = orEmpty(v), orEmpty(nv)
	}
	for _, m := range n.Members() {
		role := roleBroker
		if m.Voter {
			role = roleVoter
		}
		ms := MemberStatus{ID: m.ID, State: m.Status, Role: role,
			MQTTAddr: m.MQTTAddr, ClusterAddr: m.ClusterAddr, Version: m.Version, BrokerEpoch: m.Epoch}
		ms.Removal, ms.Holds = removal(st, m.ID)
		out.Members = append(out.Members, ms)
	}
	slices.SortFunc(out.Members, func(a, b MemberStatus) int { return strings.Compare(a.ID, b.ID) })
	var sessions *rules.Stream // listed last: the configured streams come first
	for _, name := range st.StreamNames() {
		if name == SessionsStream {
			sessions = st.Streams[name]
			continue
		}
		out.Streams = append(out.Streams, s.streamStatus(st.Streams[name]))
	}
	if sessions != nil {
		out.Streams = append(out.Streams, s.streamStatus(sessions))
	}
	out.Ready, out.NotReady = readiness(st, n.ID(), n.Epoch(), out.Controller, !n.CutOff())
	return out
}

func (s *Site) streamStatus(x *rules.Stream) StreamStatus {
	self := s.Node.ID()
	ss := StreamStatus{
		Name: x.Name, Leader: x.Leader, LeaderEpoch: x.LeaderEpoch, Version: x.Version,
		Replicas: orEmpty(slices.Clone(x.Replicas)), ISR: orEmpty(slices.Clone(x.ISR)),
		ReplicationFactor: x.Want(), UnderReplicated: len(x.ISR) < len(x.Replicas) || len(x.Replicas) < x.Want(),
		Moving: slices.Clone(x.Moves),
	}
	if slices.Contains(x.Replicas, self) && s.cfg.Store != nil {
		if local := s.cfg.Store.Stream(x.Name); local != nil {
			ss.LocalReplica = true
			ss.HighWatermark, ss.LogEnd = local.Committed(), local.NextOffset()
		}
	}
	if x.Leader != self {
		return ss
	}
	ld, _ := s.Replicator.Leading(x.Name)
	if ld == nil || ld.epoch != x.LeaderEpoch {
		return ss // the Replicator has not caught up with the state yet
	}
	pos, end := ld.Positions()
	for _, r := range x.Replicas {
		rl := ReplicaLag{ID: r, InISR: x.InISR(r)}
		switch p, ok := pos[r]; {
		case r == self:
			rl.Fetched, rl.LogEnd = true, end
		case ok:
			rl.Fetched, rl.LogEnd = true, p.LogEnd
		}
		if rl.LogEnd < end {
			rl.LagRecords = end - rl.LogEnd
		}
		ss.ReplicaLag = append(ss.ReplicaLag, rl)
	}
	return ss
}

// removal is a member's decommission progress for MemberStatus.
func removal(st *rules.State, id string) (string, []string) {
	b := st.Brokers[id]
	switch {
	case b == nil:
		return "", nil
	case b.Removed:
		return "removed", nil
	case !b.Draining:
		return "", nil
	}
	if holds := st.ReplicaOf(id); len(holds) > 0 {
		return "draining", holds
	}
	return "drained", nil
}

// CaughtUp reports whether this node serves its part of the site: a
// controller is known, the controller has registered this run's broker
// epoch, and the node is in the ISR of every stream it holds a replica
// of. A restarted node is not until it has caught up with the leaders
// and been taken back into their ISRs. The reason names what is missing.
func (s *Site) CaughtUp() (ok bool, reason string) {
	st, _ := s.Node.State()
	return readiness(st, s.Node.ID(), s.Node.Epoch(), s.Node.Controller(), !s.Node.CutOff())
}

// readiness is CaughtUp's rule on a state, without I/O; inTouch is
// !Node.CutOff.
func readiness(st *rules.State, self string, epoch uint64, controller string, inTouch bool) (bool, string) {
	var why []string
	switch {
	case controller == "":
		why = append(why, "no controller known (the site has no quorum, or this node cannot reach it)")
	case !inTouch:
		// A minority, or a link to the controller lost: what this node
		// leads is refused, and its copy of the state may be stale.
		why = append(why, fmt.Sprintf("cut off from the controller %s (no Raft contact or heartbeat answered lately): "+
			"publishes to streams this node leads are refused", controller))
	}
	switch b := st.Brokers[self]; {
	case b == nil || b.Epoch != epoch:
		why = append(why, fmt.Sprintf("the controller has not registered this node's broker epoch %d yet", epoch))
	case !b.Alive:
		why = append(why, "the controller counts this node as failed")
	}
	var behind []string
	for _, name := range st.StreamNames() {
		x := st.Streams[name]
		if slices.Contains(x.Replicas, self) && !x.InISR(self) {
			behind = append(behind, name)
		}
	}
	if len(behind) > 0 {
		why = append(why, fmt.Sprintf("a replica outside the ISR (catching up) of stream(s) %s", strings.Join(behind, ", ")))
	}
	if len(why) > 0 {
		return false, strings.Join(why, "; ")
	}
	return true, ""
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
