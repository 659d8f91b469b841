package cluster

import (
	"context"
	"fmt"
)

// Removal is what RemoveNode started.
type Removal struct {
	Node string `json:"node"`
	// Moving are the streams whose replica on the node the controller
	// moves to other brokers (none left: the node held no replica).
	Moving []string `json:"moving"`
}

// RemoveNode tells the site that member id is gone for good (a dead
// Raspberry Pi replaced by a new one with another node_id): the
// controller moves each of its replicas to an alive broker outside the
// stream's replicas, drops the old one once the new one is in the ISR,
// and takes the node out of Raft's configuration and Serf. It returns
// once the controller has recorded the removal; the moves follow
// (Status shows them). A member Serf sees alive is refused
// (ErrBrokerAlive): stop it first. So is the last in-sync replica of a
// stream (ErrIneligibleReplica), which alone holds what it committed.
func (s *Site) RemoveNode(ctx context.Context, id string) (Removal, error) {
	for _, m := range s.Node.Members() {
		if m.ID == id && m.Status == "alive" {
			return Removal{}, fmt.Errorf("%w: %s is alive in the site's membership: stop it first "+
				"(only a node that is gone for good is removed)", ErrBrokerAlive, id)
		}
	}
	if err := s.Node.Submit(ctx, RemoveBroker{ID: id}); err != nil {
		return Removal{}, fmt.Errorf("remove %s: %w", id, err)
	}
	st, _ := s.Node.State()
	return Removal{Node: id, Moving: orEmpty(st.replicaOf(id))}, nil
}
