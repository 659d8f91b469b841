package rules

import (
	"cmp"
	"hash/fnv"
	"slices"
	"time"
)

// PlanMoves is the controller's replica moves on st, without I/O, one
// AssignReplicas per stream that needs one (Kafka's reassignment: add
// first, remove after):
//
//   - a stream with fewer replicas outside the leaving brokers (removed
//     or draining) than its replication factor gets replicas on alive
//     brokers outside its set, those holding the fewest replicas first
//     (ties broken from a place the stream's name decides, as
//     PickReplicas spreads leaders); a new one takes a leaving one's
//     place in the replica order;
//   - a stream with more drops the extra ones (its factor was lowered):
//     never the leader, the dead and those outside the ISR first, then
//     the last in replica order, so the ISR keeps every member it can;
//   - a leaving broker leaves a stream's replicas only once every alive
//     replica it keeps is in the ISR (the new ones have caught up), so the
//     stream never has fewer in sync than before the move. A removed
//     broker (dead) goes anyway when no broker is left to move to; a
//     draining one (alive, in the ISR) only once the stream has its factor
//     on kept replicas that are all alive and in sync: a decommission is
//     never an under-replicated moment, and waits for a broker (or a lower
//     factor) when one it counted on has gone. If it leads, the first kept
//     ISR member takes over in the same command, except while hold(stream)
//     says its leader (alive: draining or a move's source) hands over
//     itself first (acks: leader, cluster.Log.leaveLeads);
//   - a replica a rebalance moves (Stream.Moves) leaves as a draining
//     broker's does, the move's target added in its place rather than
//     the least loaded broker.
//
// The new replicas catch up as any follower does and the stream's leader
// takes them into the ISR (ProposeISR). An offline stream
// (no leader to copy from) is left alone.
func PlanMoves(st *State) []AssignReplicas { return PlanMovesHolding(st, nil) }

// PlanMovesHolding is PlanMoves with hold (nil: none).
func PlanMovesHolding(st *State, hold func(stream string) bool) []AssignReplicas {
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
	for _, name := range st.StreamNames() {
		s := st.Streams[name]
		if s.Leader == "" {
			continue
		}
		var keep, gone []string
		draining := false
		for _, r := range s.Replicas {
			if moved := s.MovedFrom(r); moved || st.Leaving(r) {
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
			caughtUp = caughtUp && (s.InISR(r) || (!draining && !st.Alive(r)))
		}
		if caughtUp && hold != nil && slices.Contains(gone, s.Leader) && st.Alive(s.Leader) && hold(name) {
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
		case !st.Alive(r):
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

// PickReplicas is a new stream's replicas: rf of the alive brokers
// (sorted), starting at a place the stream's name decides, so that
// streams' leaders (the first replica) spread over the site.
func PickReplicas(name string, alive []string, rf int) []string {
	h := fnv.New32a()
	h.Write([]byte(name))
	start := int(h.Sum32() % uint32(len(alive)))
	out := make([]string, 0, rf)
	for i := range rf {
		out = append(out, alive[(start+i)%len(alive)])
	}
	return out
}

// PlanMovesHeld is PlanMoves holding, for up to limit, the step that
// drops the leaving leader of a stream that handsOver (acks: leader: its
// leader may have answered records no follower has, so it elects a kept
// ISR member itself first). heldSince is when each stream was first
// held; held is the new count to keep: a stream's count goes on while its
// leader is still leaving, even in a pass that does not hold it (a kept
// replica fell out of the ISR, say), or a flapping ISR would hold a
// decommission forever. next is when the first hold ends (zero: none);
// overdue are the streams held for limit already, moved at once now.
func PlanMovesHeld(st *State, handsOver func(stream string) bool, heldSince map[string]time.Time, now time.Time,
	limit time.Duration) (moves []AssignReplicas, held map[string]time.Time, next time.Time, overdue []string) {
	held = map[string]time.Time{}
	hold := func(name string) bool {
		if handsOver == nil || !handsOver(name) {
			return false
		}
		since, ok := heldSince[name]
		if !ok {
			since = now
		}
		held[name] = since
		if due := since.Add(limit); now.Before(due) {
			if next.IsZero() || due.Before(next) {
				next = due
			}
			return true
		}
		overdue = append(overdue, name)
		return false
	}
	moves = PlanMovesHolding(st, hold)
	for name, since := range heldSince {
		if x := st.Streams[name]; held[name].IsZero() && x != nil && (st.Leaving(x.Leader) || x.MovedFrom(x.Leader)) {
			held[name] = since
		}
	}
	return moves, held, next, overdue
}
