package cluster

import (
	"slices"
	"time"
)

// hwTracker is a stream leader's view of its replicas' log ends, and the
// high-watermark and ISR arithmetic on it, without I/O (raft's
// commitment.go is the model). The leader feeds it every fetch; a
// follower fetching from offset o holds every record below o.
type hwTracker struct {
	self     string
	isr      []string
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
}

func newHWTracker(self string, isr []string, now time.Time) *hwTracker {
	return &hwTracker{self: self, isr: slices.Clone(isr), started: now, replicas: map[string]*replicaPos{}}
}

// fetched records a fetch by replica id from offset, answered when the
// leader's log ended at leaderEnd. A replica is caught up when it asks for
// the leader's log end, and was caught up at its previous fetch when it
// asks for at least what the leader had then (Kafka's rule: a follower
// that keeps fetching as fast as the leader appends is never behind by
// more than one round trip).
func (t *hwTracker) fetched(id string, brokerEpoch, offset, leaderEnd uint64, now time.Time) {
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
}

// setISR changes the ISR (a change the controller committed); a joiner
// it holds is no longer only joining.
func (t *hwTracker) setISR(isr []string) {
	t.isr = slices.Clone(isr)
	for id := range t.joining {
		if slices.Contains(isr, id) {
			delete(t.joining, id)
		}
	}
}

// keepJoining keeps only ids among the joiners the watermark waits for:
// the ones a proposal named (nil: its proposal failed, or none).
func (t *hwTracker) keepJoining(ids []string) {
	for id := range t.joining {
		if !slices.Contains(ids, id) {
			delete(t.joining, id)
		}
	}
}

// hw is the high watermark: the lowest log end across the ISR, the
// leader's own being leaderEnd. A member that has not fetched yet counts
// as 0: the watermark waits for it (it never moves down, logstore keeps
// the highest).
func (t *hwTracker) hw(leaderEnd uint64) uint64 {
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

// laggards are the followers in the ISR that have not been caught up for
// longer than lagMax (replica_lag_max): the leader asks the controller to
// drop them, so that the watermark stops waiting for them.
func (t *hwTracker) laggards(now time.Time, lagMax time.Duration) []string {
	var out []string
	for _, id := range t.isr {
		if id == t.self {
			continue
		}
		since := t.started
		if r := t.replicas[id]; r != nil && r.caughtUp.After(since) {
			since = r.caughtUp
		}
		if now.Sub(since) > lagMax {
			out = append(out, id)
		}
	}
	return out
}

// joiners are the replicas outside the ISR that have caught up to the
// watermark hw, with their broker epochs: the leader asks the controller
// to add them (it refuses an epoch that is not the replica's current one).
//
// Each joiner counts towards the watermark from here on (joining), until
// the ISR takes it or keepJoining drops it: hw is the watermark the
// caller last published, under the same lock as this call.
func (t *hwTracker) joiners(hw uint64) []ISRMember {
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
	slices.SortFunc(out, func(a, b ISRMember) int { return cmpString(a.ID, b.ID) })
	return out
}
