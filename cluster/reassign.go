package cluster

import (
	"cmp"
	"context"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
)

// planMoves is the controller's replica moves on st, without I/O, one
// AssignReplicas per stream that needs one (Kafka's reassignment: add
// first, remove after):
//
//   - a stream with fewer replicas outside the leaving brokers (removed
//     or draining) than its replication factor gets replicas on alive
//     brokers outside its set, those holding the fewest replicas first
//     (ties broken from a place the stream's name decides, as
//     pickReplicas spreads leaders); a new one takes a leaving one's
//     place in the replica order;
//   - a stream with more drops the extra ones (its factor was lowered):
//     never the leader, the dead and those outside the ISR first, then
//     the last in replica order, so the ISR keeps every member it can;
//   - a leaving broker leaves a stream's replicas only once every alive
//     replica it keeps is in the ISR (the new ones have caught up), so
//     the stream never has fewer in sync than before the move. A removed
//     broker (dead) goes anyway when no broker is left to move to; a
//     draining one (alive, in the ISR) only once the stream has its
//     factor on kept replicas that are all alive and in sync: a
//     decommission is never an under-replicated moment, and waits for a
//     broker (or a lower factor) when one it counted on has gone. If it
//     leads, the first kept ISR member takes over in the same command,
//     except while hold(stream) says its leader (alive: draining or a
//     move's source) hands over itself first (acks: leader, Log.leaveLeads);
//   - a replica a rebalance moves (Stream.Moves) leaves as a draining
//     broker's does, the move's target added in its place rather than
//     the least loaded broker.
//
// The new replicas catch up as any follower does and the stream's leader
// takes them into the ISR (the Replicator's rules). An offline stream
// (no leader to copy from) is left alone.
func planMoves(st *State) []AssignReplicas { return planMovesHolding(st, nil) }

// planMovesHolding is planMoves with hold (nil: none).
func planMovesHolding(st *State, hold func(stream string) bool) []AssignReplicas {
	load := map[string]int{}
	var alive []string
	for id, b := range st.Brokers {
		if b.Alive && !b.Removed && !b.Draining {
			alive = append(alive, id)
		}
	}
	slices.Sort(alive)
	for _, s := range st.Streams {
		for _, r := range s.Replicas {
			load[r]++
		}
	}
	var out []AssignReplicas
	for _, name := range st.streamNames() {
		s := st.Streams[name]
		if s.Leader == "" {
			continue
		}
		var keep, gone []string
		draining := false
		for _, r := range s.Replicas {
			if moved := s.movedFrom(r); moved || st.leaving(r) {
				gone = append(gone, r)
				b := st.Brokers[r]
				// Removed: dead, gone for good. Moved (a rebalance): as
				// draining, alive and in the ISR until it is dropped.
				draining = draining || moved || (b.Draining && !b.Removed)
			} else {
				keep = append(keep, r)
			}
		}
		want := s.Want()
		if need := want - len(keep); need > 0 {
			// A move's target first, the least loaded brokers for the rest.
			add := s.moveTargets()
			add = add[:min(need, len(add))]
			add = append(add, pickAdded(name, alive, slices.Concat(s.Replicas, add), load, need-len(add))...)
			if len(add) > 0 {
				for _, a := range add {
					load[a]++
				}
				out = append(out, AssignReplicas{Name: name, Replicas: placeAdded(s.Replicas, gone, add, s.Moves)})
				continue
			}
		}
		if extra := len(keep) - want; extra > 0 && want > 0 {
			drop := pickDropped(st, s, keep, extra)
			for _, d := range drop {
				load[d]--
			}
			out = append(out, AssignReplicas{Name: name,
				Replicas: slices.DeleteFunc(slices.Clone(s.Replicas), func(r string) bool { return slices.Contains(drop, r) })})
			continue
		}
		if len(gone) == 0 || !slices.ContainsFunc(keep, s.InISR) || (draining && len(keep) < want) {
			continue
		}
		caughtUp := true
		for _, r := range keep {
			// A dead kept replica holds a removed broker's move up only
			// while it is in sync; a draining one's always (it is alive).
			caughtUp = caughtUp && (s.InISR(r) || (!draining && !st.alive(r)))
		}
		if caughtUp && hold != nil && slices.Contains(gone, s.Leader) && st.alive(s.Leader) && hold(name) {
			continue // its leader hands over first, then this drops it
		}
		if caughtUp {
			for _, g := range gone {
				load[g]--
			}
			out = append(out, AssignReplicas{Name: name, Replicas: keep})
		}
	}
	return out
}

// pickDropped takes extra of keep to drop from s: never its leader; the
// dead first, then those outside the ISR, then the last in replica order.
func pickDropped(st *State, s *Stream, keep []string, extra int) []string {
	cands := slices.DeleteFunc(slices.Clone(keep), func(r string) bool { return r == s.Leader })
	rank := func(r string) int {
		switch {
		case !st.alive(r):
			return 0
		case !s.InISR(r):
			return 1
		}
		return 2
	}
	slices.Reverse(cands) // the last in replica order first, among equals
	slices.SortStableFunc(cands, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
	return cands[:min(extra, len(cands))]
}

// pickAdded takes up to need of the alive brokers outside replicas, the
// least loaded first, ties in the order that starts at a place name
// decides.
func pickAdded(name string, alive, replicas []string, load map[string]int, need int) []string {
	var cands []string
	for _, a := range alive {
		if !slices.Contains(replicas, a) {
			cands = append(cands, a)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	start := int(h.Sum32() % uint32(len(cands)))
	cands = append(cands[start:], cands[:start]...)
	slices.SortStableFunc(cands, func(a, b string) int { return cmp.Compare(load[a], load[b]) })
	return cands[:min(need, len(cands))]
}

// placeAdded is replicas with add inserted, each right after a leaving
// replica it replaces (so it inherits that one's rank in elections once
// the leaving one is dropped): a move's target after its source, the
// others in order, the rest at the end.
func placeAdded(replicas, gone, add []string, moves []ReplicaMove) []string {
	target := func(from string) string {
		for _, m := range moves {
			if m.From == from && slices.Contains(add, m.To) {
				return m.To
			}
		}
		return ""
	}
	rest := slices.DeleteFunc(slices.Clone(add), func(a string) bool {
		return slices.ContainsFunc(moves, func(m ReplicaMove) bool { return m.To == a })
	})
	var out []string
	for _, r := range replicas {
		out = append(out, r)
		if to := target(r); to != "" {
			out = append(out, to)
		} else if slices.Contains(gone, r) && len(rest) > 0 {
			out = append(out, rest[0])
			rest = rest[1:]
		}
	}
	return append(out, rest...)
}

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
// (RemoveBroker), and returns when the next one is due (zero: none).
func (n *Node) replaceDue(ctx context.Context, ctl *control, st *State, now time.Time) (next time.Time) {
	if n.cfg.ReplaceAfter <= 0 {
		return time.Time{}
	}
	for id := range ctl.failedSince {
		if b := st.Brokers[id]; b == nil || b.Alive || b.Removed {
			delete(ctl.failedSince, id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(st.Brokers)) {
		b := st.Brokers[id]
		if b.Alive || b.Removed {
			continue
		}
		since, ok := ctl.failedSince[id]
		if !ok {
			since = now
			ctl.failedSince[id] = now
		}
		due := since.Add(n.cfg.ReplaceAfter)
		if now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			continue
		}
		n.log.Warn("cluster: replacing a broker failed for longer than replace_after", slog.String("member", id),
			slog.Duration("replace_after", n.cfg.ReplaceAfter))
		if aerr := n.apply(ctx, RemoveBroker{ID: id}); aerr != nil {
			// Refused (the last in-sync replica of a stream, say): count
			// again, and try after another ReplaceAfter.
			n.log.Warn("cluster: broker not removed", slog.String("member", id), slog.Any("err", aerr))
			ctl.failedSince[id] = now
			if due := now.Add(n.cfg.ReplaceAfter); next.IsZero() || due.Before(next) {
				next = due
			}
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

// reassign makes the moves planMoves asks for on the state now, holding
// the move of an acks: leader stream whose leader leaves for up to
// handOffLimit (ctl.heldSince). It returns when the next hold ends (zero:
// none).
func (n *Node) reassign(ctx context.Context, ctl *control, now time.Time) (next time.Time, err error) {
	st, _ := n.fsm.State()
	held := map[string]time.Time{}
	hold := func(name string) bool {
		if n.cfg.AcksLeader == nil || !n.cfg.AcksLeader(name) {
			return false
		}
		since, ok := ctl.heldSince[name]
		if !ok {
			since = now
		}
		held[name] = since
		if due := since.Add(handOffLimit); now.Before(due) {
			next = earliest(next, due)
			return true
		}
		n.log.Warn("cluster: moving an acks: leader stream's leader at once: it did not hand over (records it acknowledged last may be lost)",
			slog.String("stream", name), slog.String("leader", st.Streams[name].Leader), slog.Duration("waited", now.Sub(since)))
		return false
	}
	moves := planMovesHolding(st, hold)
	for name, since := range ctl.heldSince {
		// Not due this pass (a kept replica fell out of the ISR, say)
		// but its leader still leaving: the count goes on, or a flapping
		// ISR would hold the decommission forever.
		if x := st.Streams[name]; held[name].IsZero() && x != nil && (st.leaving(x.Leader) || x.movedFrom(x.Leader)) {
			held[name] = since
		}
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
