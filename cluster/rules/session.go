package rules

import "time"

// Broker sessions (KRaft's broker heartbeats, KIP-631).
//
// Serf tells who is alive by gossip: a node that only the controller
// cannot reach stays alive to it, and a leader cut off from the
// controller alone would freeze its streams (it stops committing, rule 7
// of doc.go, and nothing deposes it). So every broker also heartbeats the
// controller directly, every heartbeat interval, and the controller
// counts a broker alive only while its session holds: a heartbeat within
// the session timeout, from a broker whose Raft still follows the
// controller's log. One whose session expires is fenced like a failed
// one (BrokerFailed: out of every ISR, its leaderships to in-sync
// replicas); its next heartbeat registers it again. A leader fences
// itself first: it stops committing once the heartbeat it last had
// answered was sent longer ago than SelfFenceAfter, which is shorter
// than the session timeout, counted from an earlier instant (the send,
// not the answer): so it has stopped before the controller can have
// fenced it.

// HeartbeatCounts reports whether a heartbeat keeps its sender's session:
// its Raft heard the controller within heartbeatTimeout (the Raft
// heartbeat timeout, InTouch's), so the state it acts on follows the
// controller's. A broker whose link carries heartbeats but not Raft must
// not keep leading on a state it no longer receives.
func HeartbeatCounts(raftContact, heartbeatTimeout time.Duration) bool {
	return raftContact < heartbeatTimeout
}

// SessionLive reports whether a broker's session holds at now: the
// controller counted a heartbeat from it at heard (zero: none in this
// controller's term), or it has been controller since leading, for less
// than timeout. A new controller gives every broker a whole session
// before it fences any.
func SessionLive(heard, leading, now time.Time, timeout time.Duration) bool {
	last := heard
	if leading.After(last) {
		last = leading
	}
	return now.Sub(last) < timeout
}

// SessionExpiry is when a session that SessionLive finds live expires.
func SessionExpiry(heard, leading time.Time, timeout time.Duration) time.Time {
	if leading.After(heard) {
		heard = leading
	}
	return heard.Add(timeout)
}

// SelfFenceAfter is how long after sending the last heartbeat the
// controller answered a broker still acts as a leader: a quarter of the
// session timeout short of it, for the fencing command's own way through
// Raft and clocks that run at slightly different rates.
func SelfFenceAfter(session time.Duration) time.Duration { return session - session/4 }
