package cluster

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/hashicorp/raft"
	"github.com/peatmq/peat/cluster/rules"
)

// Removal is what RemoveNode started.
type Removal struct {
	Node string `json:"node"`
	// Moving are the streams whose replica on the node the controller
	// moves to other brokers (none left: the node held no replica).
	Moving []string `json:"moving"`
	// Draining: the node is alive and keeps serving while its replicas
	// move (a decommission); stop it once Status shows it drained.
	Draining bool `json:"draining"`
}

// RemoveNode takes member id out of the site.
//
// A member that is gone for good (a dead Raspberry Pi replaced by a new
// one with another node_id): the controller moves each of its replicas
// to an alive broker outside the stream's replicas, drops the old one
// once the new one is in the ISR, and takes the node out of Raft's
// configuration and Serf. The last in-sync replica of a stream is
// refused (ErrIneligibleReplica): it alone holds what it committed.
//
// A member that is alive is drained (DrainBroker, a decommission): it
// keeps serving while the controller copies its replicas to other
// brokers, then drops its replicas one stream at a time once the new
// ones are in the ISR (its leaderships go to in-sync replicas in the
// same step), and demotes it from voter to non-voter. Once it holds no
// replica the operator stops it, and the controller removes it as
// above. Refused when a stream it holds would have no broker to move to
// (ErrIneligibleReplica), or when it is a voter without which fewer
// than a majority of the remaining voters are alive (ErrQuorum).
//
// It returns once the controller has recorded the removal or drain; the
// moves follow (Status shows them).
func (s *Site) RemoveNode(ctx context.Context, id string) (Removal, error) {
	var alive bool
	up := map[string]bool{}
	for _, m := range s.Node.Members() {
		up[m.ID] = m.Status == "alive"
		if m.ID == id {
			alive = m.Status == "alive"
		}
	}
	var c rules.Command = rules.RemoveBroker{ID: id}
	if alive {
		voters, _, err := s.Node.Quorum()
		if err != nil {
			return Removal{}, fmt.Errorf("remove %s: %w", id, err)
		}
		if err := rules.QuorumWithout(id, voters, func(v string) bool { return up[v] }); err != nil {
			return Removal{}, err
		}
		c = rules.DrainBroker{ID: id}
	}
	if err := s.Node.Submit(ctx, c); err != nil {
		return Removal{}, fmt.Errorf("remove %s: %w", id, err)
	}
	st, _ := s.Node.State()
	return Removal{Node: id, Moving: orEmpty(st.ReplicaOf(id)), Draining: alive}, nil
}

// KeepNode ends member id's drain, a decommission started by mistake or
// no longer wanted (KeepBroker): it may get replicas again and, if its
// configuration makes it a voter, rejoins the controller's quorum. The
// replicas that already moved stay where they are. It returns once the
// controller has recorded it. Refused (ErrRemovedBroker) once the drain
// has ended in a removal: the node was stopped after its last replica
// moved.
func (s *Site) KeepNode(ctx context.Context, id string) error {
	if err := s.Node.Submit(ctx, rules.KeepBroker{ID: id}); err != nil {
		return fmt.Errorf("keep %s: %w", id, err)
	}
	return nil
}

// demoteDraining makes a draining voter a non-voter (it keeps following
// the state while it serves), when the quorum allows it; a controller
// that is draining hands the controller to another voter first, which
// demotes it.
func (n *Node) demoteDraining(m Member, inRaft map[string]raft.Server) error {
	srv, ok := inRaft[m.ID]
	if !ok || srv.Suffrage != raft.Voter {
		return nil
	}
	if m.ID == n.cfg.NodeID {
		n.log.Info("cluster: draining controller hands the controller over")
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			return fmt.Errorf("hand the controller over before leaving the quorum: %w", err)
		}
		return nil
	}
	var voters []string
	for id, v := range inRaft {
		if v.Suffrage == raft.Voter {
			voters = append(voters, id)
		}
	}
	up := map[string]bool{}
	for _, mm := range n.Members() {
		up[mm.ID] = mm.Status == "alive"
	}
	if err := rules.QuorumWithout(m.ID, voters, func(v string) bool { return up[v] }); err != nil {
		n.log.Warn("cluster: draining voter stays in the quorum for now", slog.String("member", m.ID), slog.Any("err", err))
		return nil
	}
	n.log.Info("cluster: draining voter leaves the quorum", slog.String("member", m.ID))
	if err := n.raft.DemoteVoter(raft.ServerID(m.ID), 0, n.cfg.ApplyTimeout).Error(); err != nil {
		return fmt.Errorf("demote %s: %w", m.ID, err)
	}
	srv.Suffrage = raft.Nonvoter
	inRaft[m.ID] = srv
	return nil
}
