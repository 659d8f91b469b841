package rules

import (
	"slices"
	"time"
)

// ProposeISR is the AlterISR that self, leading stream name in leader
// epoch epoch, should ask the controller for now, if any, and the
// replicas it adds: the ISR of st without the laggards (followers not
// caught up for replica_lag_max, or silent for the session timeout:
// Tracker.Laggards at now), with the
// joiners (replicas caught up to the watermark in the broker epoch
// given: Tracker.Joiners) that are alive replicas outside the ISR and
// still run in that epoch. ok is false when there is nothing to change,
// or st no longer names self leader in epoch (the caller's role is
// replaced). The controller checks the proposal again (State.Apply's
// compare-and-set): a deposed leader's proposal is refused there.
func ProposeISR(st *State, name, self string, epoch uint32, laggards []string, joiners []ISRMember) (c AlterISR, added []string, ok bool) {
	s := st.Streams[name]
	if s == nil || s.Leader != self || s.LeaderEpoch != epoch {
		return AlterISR{}, nil, false
	}
	var isr []ISRMember
	for _, id := range s.ISR {
		if b := st.Brokers[id]; b != nil && !slices.Contains(laggards, id) {
			isr = append(isr, ISRMember{ID: id, Epoch: b.Epoch})
		}
	}
	changed := len(isr) != len(s.ISR)
	for _, j := range joiners {
		// Only a replica caught up in the epoch it runs now rejoins.
		if b := st.Brokers[j.ID]; b != nil && b.Alive && b.Epoch == j.Epoch && slices.Contains(s.Replicas, j.ID) && !s.InISR(j.ID) {
			isr = append(isr, j)
			added = append(added, j.ID)
			changed = true
		}
	}
	if !changed {
		return AlterISR{}, nil, false
	}
	return AlterISR{Name: name, Leader: self, LeaderEpoch: s.LeaderEpoch, Version: s.Version, ISR: isr}, added, true
}

// MayCommit reports whether self, leading stream name in leader epoch
// epoch, may still move its watermark: st still names it leader in that
// epoch, and it is in touch with the controller (InTouch).
func MayCommit(st *State, name, self string, epoch uint32, inTouch bool) bool {
	s := st.Streams[name]
	return s != nil && s.Leader == self && s.LeaderEpoch == epoch && inTouch
}

// InTouch reports whether a node is the controller, or heard from it
// sinceContact ago, less than the heartbeat timeout. The controller
// deposes a leader only after an election it commits, for a failure Serf
// takes longer than that to declare, so a leader cut off from it stops
// committing (MayCommit), and acting as leader outside the log, before it
// is deposed. (A partition in which Serf declares a node failed while its
// Raft still hears the controller is not covered by this argument.)
func InTouch(controller bool, sinceContact, heartbeat time.Duration) bool {
	return controller || sinceContact < heartbeat
}

// Leader is who node self, running in broker epoch brokerEpoch, takes
// for stream name's leader, and in which leader epoch: self leads (it is
// the leader), or follows (as a replica or an observer: the watermark
// counts only the ISR). ok is false when the stream is unknown or has no
// leader, and when the state names self leader but has not registered
// this incarnation yet: a restarted node's state may predate its
// registration, which fences the old incarnation's leaderships, and a
// snapshot naming it the sole ISR member of a stream that moved on since
// would let it acknowledge records the stream's leader never gets.
func Leader(st *State, name, self string, brokerEpoch uint64) (leader string, epoch uint32, ok bool) {
	s := st.Streams[name]
	if s == nil || s.Leader == "" {
		return "", 0, false
	}
	if s.Leader == self {
		if b := st.Brokers[self]; b == nil || b.Epoch != brokerEpoch {
			return "", 0, false
		}
	}
	return s.Leader, s.LeaderEpoch, true
}

// Unanswered is an AlterISR whose outcome the leader does not know (its
// submission timed out or its connection broke): it may still commit, as
// long as the stream's version is the one it named (the compare-and-set).
type Unanswered struct {
	Version uint64   // the version the proposal named
	Added   []string // the replicas it added
}

// StillJoining are the joiners a leader's watermark must keep waiting
// for besides the state's ISR (committed) and its current proposal's
// additions (added): those of an unanswered proposal u while the stream
// is still at u's version, since the controller may yet commit it and
// then elect one of them. Once the version moved, u can never commit:
// what it added is in the ISR, or never will be from it (Kafka keeps one
// AlterPartition in flight for the same reason).
func StillJoining(committed, added []string, u Unanswered, version uint64) []string {
	out := slices.Concat(committed, added)
	if u.Version == version {
		for _, id := range u.Added {
			if !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}
