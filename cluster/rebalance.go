package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/peatmq/peat/cluster/rules"
)

// Rebalancing is what Rebalance started.
type Rebalancing struct {
	// Moves are the replica moves recorded now (none: nothing to move).
	Moves []rules.StreamMove `json:"moves"`
	// Replicas is each broker's replica count once every move is done
	// (those alive and not leaving: the brokers that may hold replicas).
	Replicas map[string]int `json:"replicas"`
	// Balanced: then no broker holds more than one replica more than
	// another. False with no moves: the streams that would move are
	// under-replicated, out of sync or moving; run it again once they
	// are not.
	Balanced bool `json:"balanced"`
}

// Rebalance spreads replicas over the brokers that may hold them
// (rules.PlanRebalance on this node's state), typically after brokers joined:
// a stream keeps its replicas until a broker leaves or its factor
// changes, so a site grown from 3 to 5 nodes would otherwise keep every
// stream on the first three. It records the moves (MoveReplicas) and
// returns once the controller has; the moves follow, add first and
// remove after (Status shows them). The controller refuses the whole
// plan (ErrBadReplicas, ErrIneligibleReplica and the like) when its
// state has moved on from this node's meanwhile: run it again.
func (s *Site) Rebalance(ctx context.Context) (Rebalancing, error) {
	st, _ := s.Node.State()
	moves, load := rules.PlanRebalance(st)
	out := Rebalancing{Moves: moves, Replicas: load, Balanced: rules.Balanced(load)}
	if out.Moves == nil {
		out.Moves = []rules.StreamMove{}
		return out, nil
	}
	err := s.Node.Submit(ctx, rules.MoveReplicas{Moves: moves})
	switch {
	case errors.Is(err, ErrBadCommand):
		return Rebalancing{}, fmt.Errorf("rebalance: %w (the controller runs a Peat without rebalance: upgrade every node first)", err)
	case err != nil:
		return Rebalancing{}, fmt.Errorf("rebalance: %w", err)
	}
	return out, nil
}
