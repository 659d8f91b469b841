package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
	"github.com/peatmq/peat/cluster/rules"
)

// Moving replicas: the controller's side here, the operator's in
// remove.go (RemoveNode, KeepNode) and rebalance.go (Rebalance), a
// node's in balance.go (its factors, leader balancing, its hand-overs).
// What moves is rules.PlanMoves's (rules/doc.go, "Moving replicas").
//
// A stream keeps the replicas it was created on until a broker is
// removed or drained, until its replica count differs from its
// ReplicationFactor (created on a site with fewer brokers, or the factor
// changed), or until a rebalance moves them. A broker is removed by an
// operator (Site.RemoveNode: `peat cluster remove-node`, POST
// /api/v1/cluster/nodes/<id>/remove) or, with Config.ReplaceAfter
// (cluster.replace_after, 0 = never), by the controller once it has seen
// it failed that long (replaceDue). The count is in the controller's
// memory, from when it first saw the failure: a new controller starts
// again, so a clock jump (a Pi without a clock battery) or a change of
// controller can only delay a replacement, never hasten it. A failed
// broker is never moved on a guess: a Pi rebooting, or a cable pulled for
// an hour, must not copy every stream again onto another node's flash.
//
// On every state change, member event and ReconcileInterval the
// controller applies the AssignReplicas rules.PlanMoves asks for
// (reassign). A new replica is already an observer fetching the stream
// (every node is), or starts to; its leader takes it into the ISR once it
// has caught up and acknowledged the consumer state (rules.ProposeISR
// counts replicas only, so it joins once the state names it). Each pass
// also takes a removed member out of Raft's configuration (a 3-voter site
// then has 2 voters until a new voter joins) and out of Serf
// (force-leave, pruned: no more probes or reconnects). A leader's
// min_insync_replicas default follows its replica count as it changes.
//
// A live node is decommissioned by the same command: RemoveNode of a
// member Serf sees alive submits DrainBroker instead. The node keeps
// serving while its replicas move. When it leads an acks: leader stream
// (Config.AcksLeader, which StartSite sets), whose leader may have
// answered records no follower has, the controller holds the step that
// drops it (rules.PlanMovesHolding) and the leader, seeing in the state
// that its replica is to go, drains the stream as leader balancing does
// and elects the first kept, alive ISR member itself (Log.leaveLeads);
// the next pass drops it. A leader that fails takes appends again and
// tries after balanceRetry; after handOffLimit (counted in the
// controller's memory) the controller moves it at once and logs a
// warning: a decommission never hangs on a follower that cannot keep up,
// or on a leader running an older Peat. Once it holds no replica the
// controller demotes a draining voter to non-voter (it follows the state,
// so its clients' publishes are still forwarded right) if the voters
// left alive stay a majority of those remaining (rules.QuorumWithout); a
// draining controller first hands Raft's leadership over. Status shows
// the member "draining", then "drained": the operator stops it, Serf
// reports it failed, and the controller submits RemoveBroker and forgets
// it as above.

// control is what one term of the controller remembers between passes.
type control struct {
	// failedSince is when this controller first saw each broker failed:
	// a new controller starts counting again, so cluster.replace_after
	// is never cut short by a clock or by a change of controller.
	failedSince map[string]time.Time
	// heldSince is when it first held each acks: leader stream's move
	// for its leaving leader to hand over (reassign), counted afresh by
	// a new controller too.
	heldSince map[string]time.Time
}

// replaceDue removes brokers failed for longer than ReplaceAfter
// (rules.PlanReplacements), and returns when the next one is due (zero:
// none).
func (n *Node) replaceDue(ctx context.Context, ctl *control, st *rules.State, now time.Time) (next time.Time) {
	if n.cfg.ReplaceAfter <= 0 {
		return time.Time{}
	}
	due, next := rules.PlanReplacements(st, ctl.failedSince, now, n.cfg.ReplaceAfter)
	for _, id := range due {
		n.log.Warn("cluster: replacing a broker failed for longer than replace_after", slog.String("member", id),
			slog.Duration("replace_after", n.cfg.ReplaceAfter))
		if aerr := n.apply(ctx, rules.RemoveBroker{ID: id}); aerr != nil {
			// Refused (the last in-sync replica of a stream, say): count
			// again, and try after another ReplaceAfter.
			n.log.Warn("cluster: broker not removed", slog.String("member", id), slog.Any("err", aerr))
			ctl.failedSince[id] = now
			next = earliest(next, now.Add(n.cfg.ReplaceAfter))
		}
	}
	return next
}

// handOffLimit is how long the controller leaves an acks: leader stream's
// leadership to a leaving leader (Log.leaveLeads, which tries every
// balanceRetry with a drain of up to 2 s) before it moves the stream at
// once, as for any other: a decommission never waits forever on a
// follower that cannot catch up, or on a leader that does not try (an
// older Peat).
const handOffLimit = 30 * time.Second

// reassign makes the moves rules.PlanMovesHeld asks for on the state now,
// holding the move of an acks: leader stream whose leader leaves for up
// to handOffLimit (ctl.heldSince). It returns when the next hold ends (zero:
// none).
func (n *Node) reassign(ctx context.Context, ctl *control, now time.Time) (next time.Time, err error) {
	st, _ := n.fsm.State()
	moves, held, next, overdue := rules.PlanMovesHeld(st, n.cfg.AcksLeader, ctl.heldSince, now, handOffLimit)
	for _, name := range overdue {
		n.log.Warn("cluster: moving an acks: leader stream's leader at once: it did not hand over (records it acknowledged last may be lost)",
			slog.String("stream", name), slog.String("leader", st.Streams[name].Leader), slog.Duration("waited", now.Sub(held[name])))
	}
	ctl.heldSince = held
	for _, c := range moves {
		n.log.Info("cluster: moving replicas", slog.String("stream", c.Name), slog.Any("from", st.Streams[c.Name].Replicas),
			slog.Any("to", c.Replicas))
		if err := n.apply(ctx, c); err != nil {
			return next, err
		}
	}
	return next, nil
}

// forgetRemoved takes a removed broker out of Raft's configuration and,
// while Serf still lists it failed, out of Serf (force-leave: no more
// probes or reconnects).
func (n *Node) forgetRemoved(id string, sm *serf.Member, inRaft map[string]raft.Server) error {
	if sm != nil && sm.Status == serf.StatusFailed {
		n.log.Info("cluster: removed member leaves serf", slog.String("member", id))
		if err := n.serf.RemoveFailedNodePrune(id); err != nil {
			n.log.Warn("cluster: force-leave", slog.String("member", id), slog.Any("err", err))
		}
	}
	return n.removeServer(id, inRaft)
}
