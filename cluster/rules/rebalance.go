package rules

import (
	"cmp"
	"fmt"
	"slices"
)

// Spreading replicas onto brokers that joined later:
// cluster.Site.Rebalance plans moves (PlanRebalance) and records them in the
// state (MoveReplicas); PlanMoves then makes each one as it makes a
// drain, add first and remove after.

// ReplicaMove is one replica a stream gives up: To takes From's place.
type ReplicaMove struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// StreamMove is a ReplicaMove of stream Stream.
type StreamMove struct {
	Stream string `json:"stream"`
	From   string `json:"from"`
	To     string `json:"to"`
}

// MoveReplicas records replica moves (`peat cluster rebalance`): for
// each, the controller adds To to the stream's replicas, and once To is
// in the ISR (and every other kept replica is), drops From, handing its
// leadership, if it leads, to a kept ISR member in the same step.
// Refused, changing nothing, unless every move is of a stream with a
// leader and no move under way, from one of its replicas alive and not
// leaving, to an alive broker, not leaving, outside its replicas. A
// move ends when From leaves the replicas, and is dropped when From
// fails or leaves the site, or To does (pruneMoves).
type MoveReplicas struct {
	Moves []StreamMove
}

func (MoveReplicas) kind() byte { return kindMoveReplicas }

// holds reports whether broker id may hold replicas: alive, neither
// removed nor draining.
func (s *State) Holds(id string) bool {
	return s.Alive(id) && !s.Leaving(id)
}

func (s *State) moveReplicas(c MoveReplicas) error {
	if len(c.Moves) == 0 {
		return fmt.Errorf("%w: no move", ErrBadCommand)
	}
	moving := map[string]bool{} // streams with a move under way before c
	for name, st := range s.Streams {
		moving[name] = len(st.Moves) > 0
	}
	for _, m := range c.Moves {
		st := s.Streams[m.Stream]
		switch {
		case st == nil:
			return fmt.Errorf("%w: %s", ErrUnknownStream, m.Stream)
		case moving[m.Stream]:
			return fmt.Errorf("%w: %s: a move is under way (%v)", ErrBadReplicas, m.Stream, st.Moves)
		case st.Leader == "":
			return fmt.Errorf("%w: %s is offline", ErrIneligibleReplica, m.Stream)
		case s.Brokers[m.To] == nil:
			return fmt.Errorf("%w: %s", ErrUnknownBroker, m.To)
		case !slices.Contains(st.Replicas, m.From) || slices.ContainsFunc(st.Moves, func(o ReplicaMove) bool { return o.From == m.From }):
			return fmt.Errorf("%w: %s: %s is not a replica, or moves twice", ErrBadReplicas, m.Stream, m.From)
		case slices.Contains(st.Replicas, m.To) || slices.ContainsFunc(st.Moves, func(o ReplicaMove) bool { return o.To == m.To }):
			return fmt.Errorf("%w: %s: %s is a replica already, or a target twice", ErrBadReplicas, m.Stream, m.To)
		case !s.Holds(m.From) || !s.Holds(m.To):
			return fmt.Errorf("%w: %s: %s -> %s: both must be alive and not leaving the site", ErrIneligibleReplica,
				m.Stream, m.From, m.To)
		}
		st.Moves = append(st.Moves, ReplicaMove{From: m.From, To: m.To})
	}
	return nil
}

// pruneMoves ends the moves that are done (From is no longer a replica)
// and drops those that cannot go on: From or To failed, removed or
// draining. A target already added then is an extra replica, dropped as
// a lowered factor's is (the dead first); a dead source is dropped the
// same way once its target is in.
func (s *State) pruneMoves() {
	for _, st := range s.Streams {
		if len(st.Moves) == 0 {
			continue
		}
		st.Moves = slices.DeleteFunc(st.Moves, func(m ReplicaMove) bool {
			return !slices.Contains(st.Replicas, m.From) || !s.Holds(m.From) || !s.Holds(m.To)
		})
		if len(st.Moves) == 0 {
			st.Moves = nil // as a state without moves decodes
		}
	}
}

// movedFrom reports whether r is a replica st is giving up.
func (st *Stream) MovedFrom(r string) bool {
	return slices.ContainsFunc(st.Moves, func(m ReplicaMove) bool { return m.From == r })
}

// moveTargets are st's move targets not yet among its replicas.
func (st *Stream) moveTargets() []string {
	var out []string
	for _, m := range st.Moves {
		if !slices.Contains(st.Replicas, m.To) {
			out = append(out, m.To)
		}
	}
	return out
}

// PlanRebalance is cluster.Site.Rebalance's plan on st, without I/O: moves from
// the brokers holding the most replicas to those holding the fewest,
// among the brokers that may hold them (alive, not leaving), until no
// broker holds more than one more than another, or no stream can move.
// It also returns each of those brokers' replica count once every move,
// planned or under way, is done.
//
// Only settled streams move: a leader, as many replicas as their factor,
// all alive, in the ISR and staying, and no move under way (the others
// finish what they are doing first; a rebalance run then takes them).
// Each step takes the most loaded broker that can give a replica to the
// least loaded one that can take it (ties: broker id order), and the
// first stream in name order that has a replica on the one and none on
// the other, one its source follows before one it leads (a leader's move
// is a change of leader too: an acks: leader stream's leader hands over
// itself first, as on a drain, cluster.Log.leaveLeads). Every step lowers the
// spread, so planning ends.
func PlanRebalance(st *State) ([]StreamMove, map[string]int) {
	load := map[string]int{}
	var hold []string
	for id := range st.Brokers {
		if st.Holds(id) {
			hold = append(hold, id)
			load[id] = 0
		}
	}
	slices.Sort(hold)
	after := map[string][]string{} // a stream's replicas once its moves are done
	for _, name := range st.StreamNames() {
		x := st.Streams[name]
		rs := slices.Clone(x.Replicas)
		for _, m := range x.Moves {
			rs = slices.DeleteFunc(rs, func(r string) bool { return r == m.From })
			if !slices.Contains(rs, m.To) {
				rs = append(rs, m.To)
			}
		}
		after[name] = rs
		for _, r := range rs {
			if _, ok := load[r]; ok {
				load[r]++
			}
		}
	}
	var movable []string
	for _, name := range st.StreamNames() {
		x := st.Streams[name]
		if x.Leader != "" && len(x.Moves) == 0 && len(x.Replicas) == x.Want() && len(x.ISR) == len(x.Replicas) &&
			!slices.ContainsFunc(x.Replicas, func(r string) bool { return !st.Holds(r) }) {
			movable = append(movable, name)
		}
	}
	// pick is the stream to move a replica of from src to dst ("" for
	// none): src must still be one of its replicas (not a target of
	// this plan), dst none of them.
	pick := func(src, dst string) string {
		for _, leading := range []bool{false, true} {
			for _, name := range movable {
				x := st.Streams[name]
				if (x.Leader == src) != leading {
					continue
				}
				if slices.Contains(x.Replicas, src) && slices.Contains(after[name], src) && !slices.Contains(after[name], dst) {
					return name
				}
			}
		}
		return ""
	}
	var out []StreamMove
	for {
		byLoad := func(a, b string) int { return cmp.Compare(load[a], load[b]) }
		srcs := slices.Clone(hold)
		slices.SortStableFunc(srcs, func(a, b string) int { return byLoad(b, a) })
		dsts := slices.Clone(hold)
		slices.SortStableFunc(dsts, byLoad)
		var move *StreamMove
	find:
		for _, src := range srcs {
			for _, dst := range dsts {
				if load[src]-load[dst] < 2 {
					break // dsts only get more loaded from here
				}
				if name := pick(src, dst); name != "" {
					move = &StreamMove{Stream: name, From: src, To: dst}
					break find
				}
			}
		}
		if move == nil {
			return out, load
		}
		out = append(out, *move)
		load[move.From]--
		load[move.To]++
		rs := after[move.Stream]
		rs[slices.Index(rs, move.From)] = move.To
	}
}

// balanced reports whether no broker's count is more than one above
// another's.
func Balanced(load map[string]int) bool {
	if len(load) == 0 {
		return true
	}
	lo, hi := -1, 0
	for _, n := range load {
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	return hi-lo <= 1
}
