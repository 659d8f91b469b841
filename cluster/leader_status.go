package cluster

// ReplicaPosition is a replica's log end as the stream's leader last
// heard it (the offset of its last fetch).
type ReplicaPosition struct {
	ID          string
	LogEnd      uint64
	BrokerEpoch uint64 // the broker epoch it fetched in
}

// Positions returns the followers' log ends as this leader tracks them,
// and its own log end. A follower that has not fetched from this leader
// yet is missing: the high watermark counts it as 0.
func (l *Leader) Positions() (followers map[string]ReplicaPosition, leaderEnd uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pos := l.mu.tr.Positions()
	followers = make(map[string]ReplicaPosition, len(pos))
	for id, p := range pos {
		followers[id] = ReplicaPosition{ID: id, LogEnd: p.LogEnd, BrokerEpoch: p.BrokerEpoch}
	}
	return followers, l.stream.NextOffset()
}
