package rules

import (
	"slices"
	"strings"
	"time"
)

// Tracker is a stream leader's view of its replicas' log ends, and the
// high-watermark, minimum-ISR and ISR arithmetic on it, without I/O
// (raft's commitment.go is the model). The leader feeds it every fetch;
// a follower fetching from offset o holds every record below o. It has
// no lock: its owner (cluster.Leader) holds one around every call.
type Tracker struct {
	self     string
	isr      []string
	minISR   int // below it, the watermark does not move (min_insync_replicas)
	started  time.Time
	replicas map[string]*replicaPos
	// joining are the replicas named as joiners and not yet in the ISR the
	// controller committed: the watermark counts them already (Kafka's
	// maximal ISR, KIP-497), or it could pass a joiner's log end while its
	// addition is on the way, and a committed record would be missing on
	// an ISR member that may be elected.
	joining map[string]bool
}

type replicaPos struct {
	end         uint64    // log end: the offset of its last fetch
	brokerEpoch uint64    // the broker epoch it fetched in
	prevEnd     uint64    // the leader's log end when it answered the previous fetch
	prevAt      time.Time // and when
	caughtUp    time.Time // last time it held everything the leader had (Kafka's lastCaughtUpTime)
	heard       time.Time // last time a fetch of it arrived or its long poll ended
}

// NewTracker starts tracking for leader self with the ISR isr at now:
// an ISR member that never fetches is a laggard from now on.
func NewTracker(self string, isr []string, now time.Time) *Tracker {
	return &Tracker{self: self, isr: slices.Clone(isr), started: now, replicas: map[string]*replicaPos{}}
}

// Fetched records a fetch by replica id from offset, answered when the
// leader's log ended at leaderEnd. A replica is caught up when it asks for
// the leader's log end, and was caught up at its previous fetch when it
// asks for at least what the leader had then (Kafka's rule: a follower
// that keeps fetching as fast as the leader appends is never behind by
// more than one round trip).
func (t *Tracker) Fetched(id string, brokerEpoch, offset, leaderEnd uint64, now time.Time) {
	r := t.replicas[id]
	if r == nil || r.brokerEpoch != brokerEpoch {
		r = &replicaPos{brokerEpoch: brokerEpoch}
		t.replicas[id] = r
	}
	r.end = offset
	switch {
	case offset >= leaderEnd:
		r.caughtUp = now
	case !r.prevAt.IsZero() && offset >= r.prevEnd:
		r.caughtUp = r.prevAt
	}
	r.prevEnd, r.prevAt = leaderEnd, now
	r.heard = now
}

// Heard records that the leader answers a fetch of replica id at now,
// after its long poll: the replica's next fetch is a round trip away.
func (t *Tracker) Heard(id string, brokerEpoch uint64, now time.Time) {
	if r := t.replicas[id]; r != nil && r.brokerEpoch == brokerEpoch {
		r.heard = now
	}
}

// SetISR changes the ISR (a change the controller committed); a joiner
// it holds is no longer only joining.
func (t *Tracker) SetISR(isr []string) {
	t.isr = slices.Clone(isr)
	for id := range t.joining {
		if slices.Contains(isr, id) {
			delete(t.joining, id)
		}
	}
}

// KeepJoining keeps only ids among the joiners the watermark waits for:
// the ones a proposal named (nil: its proposal failed, or none).
func (t *Tracker) KeepJoining(ids []string) {
	for id := range t.joining {
		if !slices.Contains(ids, id) {
			delete(t.joining, id)
		}
	}
}

// HW is the high watermark: the lowest log end across the ISR, the
// leader's own being leaderEnd. A member that has not fetched yet counts
// as 0: the watermark waits for it (it never moves down, logstore keeps
// the highest).
func (t *Tracker) HW(leaderEnd uint64) uint64 {
	hw := leaderEnd
	for _, id := range t.isr {
		if id == t.self {
			continue
		}
		r := t.replicas[id]
		if r == nil {
			return 0
		}
		hw = min(hw, r.end)
	}
	for id := range t.joining {
		if r := t.replicas[id]; r != nil && !slices.Contains(t.isr, id) {
			hw = min(hw, r.end)
		}
	}
	return hw
}

// Laggards are the followers in the ISR that have not been caught up for
// longer than lagMax (replica_lag_max), or not heard from (no fetch) for
// longer than silentMax (0: no such bound): the leader asks the controller
// to drop them, so that the watermark stops waiting for them. A follower
// that fetches keeps a slow disk for lagMax; one that stopped fetching,
// its link to the leader cut while both still reach the controller, is
// gone as soon as a broker the controller stopped hearing from is.
func (t *Tracker) Laggards(now time.Time, lagMax, silentMax time.Duration) []string {
	var out []string
	for _, id := range t.isr {
		if id == t.self {
			continue
		}
		since, heard := t.started, t.started
		if r := t.replicas[id]; r != nil {
			since, heard = later(since, r.caughtUp), later(heard, r.heard)
		}
		if now.Sub(since) > lagMax || silentMax > 0 && now.Sub(heard) > silentMax {
			out = append(out, id)
		}
	}
	return out
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Joiners are the replicas outside the ISR that have caught up to the
// watermark hw, with their broker epochs: the leader asks the controller
// to add them (it refuses an epoch that is not the replica's current one).
//
// Each joiner counts towards the watermark from here on (joining), until
// the ISR takes it or KeepJoining drops it: hw is the watermark the
// caller last published, under the same lock as this call.
func (t *Tracker) Joiners(hw uint64) []ISRMember {
	var out []ISRMember
	for id, r := range t.replicas {
		if id != t.self && !slices.Contains(t.isr, id) && r.end >= hw {
			out = append(out, ISRMember{ID: id, Epoch: r.brokerEpoch})
			if t.joining == nil {
				t.joining = map[string]bool{}
			}
			t.joining[id] = true
		}
	}
	slices.SortFunc(out, func(a, b ISRMember) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// ISR is the ISR the tracker counts, the one the controller committed.
func (t *Tracker) ISR() []string { return slices.Clone(t.isr) }

// SetMinInsync sets min_insync_replicas: while the ISR is smaller the
// leader commits nothing, so acks=all answers nothing, even a leader
// alone in its ISR (a deposed one cannot commit on its own). 0 or 1: no
// minimum.
func (t *Tracker) SetMinInsync(n int) { t.minISR = n }

// InSync reports whether the ISR has at least min_insync_replicas
// members: when it does not, a producer's append is to be refused.
func (t *Tracker) InSync() bool { return len(t.isr) >= t.minISR }

// Advance is the watermark the leader publishes now, its own log ending
// at leaderEnd and the published one being committed: HW, when the ISR
// is in sync and HW is above committed (a watermark never moves down).
func (t *Tracker) Advance(leaderEnd, committed uint64) (hw uint64, ok bool) {
	hw = t.HW(leaderEnd)
	if !t.InSync() || hw <= committed {
		return 0, false
	}
	return hw, true
}

// HoldingAll are the ISR followers whose last fetch was from leaderEnd
// or beyond, with the broker epochs they fetched in: after a drain that
// ran out of time, the members the ISR may shrink to so that the
// controller's election cannot pick one that lacks acknowledged records.
func (t *Tracker) HoldingAll(leaderEnd uint64) []ISRMember {
	var out []ISRMember
	for _, id := range t.isr {
		if r := t.replicas[id]; id != t.self && r != nil && r.end >= leaderEnd {
			out = append(out, ISRMember{ID: id, Epoch: r.brokerEpoch})
		}
	}
	return out
}

// Position is a follower's log end as the leader last heard it (the
// offset of its last fetch), and the broker epoch it fetched in.
type Position struct {
	LogEnd      uint64
	BrokerEpoch uint64
}

// Positions are the followers' positions by id; one that has not fetched
// yet is missing (the watermark counts it as 0).
func (t *Tracker) Positions() map[string]Position {
	out := make(map[string]Position, len(t.replicas))
	for id, r := range t.replicas {
		if id != t.self {
			out[id] = Position{LogEnd: r.end, BrokerEpoch: r.brokerEpoch}
		}
	}
	return out
}
