package cluster

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/cluster/wire"
)

// Broker heartbeats and fencing (the rules are rules/session.go's).
//
// Every node but the controller sends a HeartbeatRequest to the
// controller every HeartbeatInterval, on a connection of its own (never
// behind a fetch or a forward), straight to the controller Raft names:
// a heartbeat relayed through a third node would keep alive a broker
// whose Raft, and so whose copy of the state, no longer follows. The
// controller keeps, for its term only, when it last counted one from
// each broker (sessions.heard); reconcileAll counts a member alive only
// while Serf shows it alive and its session holds, so an expired session
// is reported as a failure (BrokerFailed: out of every ISR, its
// leaderships to in-sync replicas) and the next heartbeat that counts
// registers it again (same epoch: back after a partition). leaderLoop
// wakes at the next expiry. A new controller gives each broker a whole
// session before it fences any.
//
// Nothing is relayed through a third node, neither heartbeats nor ISR
// changes. A broker cut from the controller alone has lost Raft's leader
// with it (the controller is Raft's leader): its copy of the state stops
// moving, its heartbeats would not count (RaftContactMs), and a leader
// applies an ISR only from that copy (isr.go), so a relayed AlterISR
// could commit but never unfreeze its watermark. Keeping such a broker
// leading would mean acting on answers a third node passes on rather than
// on the replicated state; KRaft's brokers do not either (KIP-631: each
// fetches the metadata log from the controllers itself). It is fenced
// instead and its streams move to an in-sync replica: clients wait about
// one failover (scripts/bench-results/partition.md, leader-controller-link).
//
// A broker remembers when it sent the last heartbeat the controller
// counted (acked). HearsController turns false SelfFenceAfter past it
// (or one Raft heartbeat timeout without Raft contact), before the
// controller can have fenced the broker: its Leaders stop committing.
// CutOff turns true SelfFenceAfter past either: its Leaders refuse new
// appends with the reason, and /readyz says so. A controller election
// (a second or two without Raft contact) holds appends, it does not
// refuse them.
//
// Versions: a node advertises the tag "hb" when it sends and counts
// heartbeats (it has a cluster address to take them on). The controller
// requires them only of members with the tag, and a broker fences itself
// on them only while the controller it knows has the tag: a rolling
// upgrade runs on Serf and Raft alone until both ends know heartbeats.

const tagHeartbeat = "hb"

// sessions is the controller's memory of the brokers' heartbeats, for
// one controller term.
type sessions struct {
	mu      sync.Mutex
	leading time.Time // when this node became controller; zero while it is not
	heard   map[string]heard
	// seen is when this controller first saw each member alive in its
	// broker epoch: a broker that joins, or restarts, late in the term
	// gets its whole session from then, not what is left of the term's.
	seen map[string]heard
}

type heard struct {
	epoch uint64 // the broker epoch the heartbeat came from
	at    time.Time
	// last: the previous controller, last heard over Raft at at (not a
	// heartbeat): it gets no grace, since a new controller is elected
	// because the site stopped hearing it, most often because it is cut
	// off or dead. Its session counts from that contact, so a cut-off
	// controller that led no stream is fenced a session after the cut,
	// not a session after the election.
	last bool
}

// beat is the broker side's record: when (since born, monotonic) it sent
// the last heartbeat the controller counted, and whether the controller
// it knows counts heartbeats at all.
type beat struct {
	born   time.Time
	acked  atomic.Int64 // ns after born; 0: none yet
	needed atomic.Bool

	mu   sync.Mutex
	last heard // the controller this node heard last: id in from, when in at
	from string
}

// startSessions begins a controller term's count, with the previous
// controller's session counted from when this node last heard it.
func (n *Node) startSessions(now time.Time) {
	n.beat.mu.Lock()
	prev, from := n.beat.last, n.beat.from
	n.beat.mu.Unlock()
	n.sessions.mu.Lock()
	defer n.sessions.mu.Unlock()
	n.sessions.leading = now
	n.sessions.heard = map[string]heard{}
	n.sessions.seen = map[string]heard{}
	if from != "" && from != n.cfg.NodeID && !prev.at.IsZero() {
		prev.last = true
		n.sessions.heard[from] = prev
	}
}

func (n *Node) endSessions() {
	n.sessions.mu.Lock()
	defer n.sessions.mu.Unlock()
	n.sessions.leading = time.Time{}
	n.sessions.heard, n.sessions.seen = nil, nil
}

// sessionLive reports whether member m's session holds for the
// controller at now: always for this node and for a member that does not
// heartbeat (an older Peat).
func (n *Node) sessionLive(m Member, now time.Time) bool {
	if m.ID == n.cfg.NodeID || m.Tags[tagHeartbeat] == "" {
		return true
	}
	n.sessions.mu.Lock()
	if sn, ok := n.sessions.seen[m.ID]; n.sessions.seen != nil && (!ok || sn.epoch != m.Epoch) {
		n.sessions.seen[m.ID] = heard{epoch: m.Epoch, at: now}
	}
	heard, since := n.lastHeardLocked(m)
	n.sessions.mu.Unlock()
	return rules.SessionLive(heard, since, now, n.cfg.SessionTimeout)
}

// lastHeard is when this controller counted member m's last heartbeat in
// the broker epoch Serf shows (zero: none), and when its grace began: the
// later of this controller's start and its first sight of m alive in
// that epoch (zero for the predecessor, which gets none).
func (n *Node) lastHeard(m Member) (heard, since time.Time) {
	n.sessions.mu.Lock()
	defer n.sessions.mu.Unlock()
	return n.lastHeardLocked(m)
}

// lastHeardLocked is lastHeard with sessions.mu held.
func (n *Node) lastHeardLocked(m Member) (heard, since time.Time) {
	since = n.sessions.leading
	if sn := n.sessions.seen[m.ID]; sn.epoch == m.Epoch && sn.at.After(since) {
		since = sn.at
	}
	h := n.sessions.heard[m.ID]
	if h.epoch != m.Epoch {
		return time.Time{}, since // another incarnation's heartbeat
	}
	if h.last {
		return h.at, time.Time{}
	}
	return h.at, since
}

// nextExpiry is when the next live session among the brokers the state
// has alive expires (zero: none), for leaderLoop to wake then.
func (n *Node) nextExpiry(st *rules.State, now time.Time) time.Time {
	var next time.Time
	for _, m := range n.Members() {
		if b := st.Brokers[m.ID]; b == nil || !b.Alive || m.ID == n.cfg.NodeID || m.Tags[tagHeartbeat] == "" {
			continue
		}
		heard, leading := n.lastHeard(m)
		if exp := rules.SessionExpiry(heard, leading, n.cfg.SessionTimeout); exp.After(now) {
			next = earliest(next, exp)
		}
	}
	return next
}

// handleHeartbeat counts a broker's heartbeat on the controller; one
// that revives a session the state has not (yet) alive nudges the
// controller loop, so a healed broker is registered again at once.
func (n *Node) handleHeartbeat(req *wire.HeartbeatRequest) wire.HeartbeatResponse {
	if !n.IsController() {
		return wire.HeartbeatResponse{Code: wire.NotController, Controller: n.Controller()}
	}
	contact := time.Duration(req.RaftContactMs) * time.Millisecond
	if !rules.HeartbeatCounts(contact, n.cfg.HeartbeatTimeout) {
		return wire.HeartbeatResponse{Code: wire.Refused}
	}
	n.sessions.mu.Lock()
	if n.sessions.heard == nil {
		n.sessions.mu.Unlock()
		return wire.HeartbeatResponse{Code: wire.NotController} // the term is ending
	}
	n.sessions.heard[req.From] = heard{epoch: req.BrokerEpoch, at: time.Now()}
	n.sessions.mu.Unlock()
	if b := n.View().Brokers[req.From]; b == nil || !b.Alive || b.Epoch != req.BrokerEpoch {
		n.nudge()
	}
	return wire.HeartbeatResponse{}
}

// heartbeatLoop sends this node's heartbeats while it runs.
func (n *Node) heartbeatLoop() {
	defer n.wg.Done()
	var conn rpcConn
	defer conn.close()
	tick := time.NewTicker(n.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		n.heartbeat(&conn)
	}
}

// heartbeat sends one heartbeat to the controller, if this node is not
// it, and notes when a counted one was sent.
func (n *Node) heartbeat(conn *rpcConn) {
	if n.IsController() {
		n.controlling()
		return
	}
	id := n.Controller()
	m, ok := n.member(id)
	if id == "" || !ok {
		return // no controller known: HearsController is false by Raft's contact already
	}
	n.beat.mu.Lock()
	n.beat.from, n.beat.last = id, heard{epoch: memberOf(m).Epoch, at: n.raft.LastContact()}
	n.beat.mu.Unlock()
	n.beat.needed.Store(m.Tags[tagHeartbeat] != "")
	addr := m.Tags[tagCluster]
	if m.Tags[tagHeartbeat] == "" || addr == "" {
		return
	}
	sent := time.Since(n.beat.born)
	req := wire.HeartbeatRequest{From: n.cfg.NodeID, BrokerEpoch: n.epoch,
		RaftContactMs: uint64(time.Since(n.raft.LastContact()).Milliseconds())}
	// Answered within an interval or two, or not at all: a heartbeat held
	// up longer is no longer news.
	ctx, cancel := context.WithTimeout(context.Background(), 2*n.cfg.HeartbeatInterval)
	defer cancel()
	var resp wire.HeartbeatResponse
	err := conn.call(ctx, n.dialer(), addr, wire.KindHeartbeatRequest, req.AppendTo(nil), wire.KindHeartbeatResponse, &resp)
	switch {
	case err != nil:
		n.log.Debug("cluster: heartbeat", slog.String("controller", id), slog.Any("err", err))
	case resp.Code == wire.None:
		n.beat.acked.Store(max(int64(sent), 1))
	default:
		n.log.Debug("cluster: heartbeat not counted", slog.String("controller", id), slog.Any("code", resp.Code))
	}
}

// controlling notes that this node is, or was until now, the controller:
// as good as a heartbeat counted, since a controller after it gives every
// broker a whole session from its own start, which comes later. So a
// controller that hands over does not count as cut off until its first
// heartbeat. Called on every change of Raft leadership (watchLeadership)
// and every heartbeat interval while it leads, not on the publish path.
func (n *Node) controlling() {
	n.beat.acked.Store(max(int64(time.Since(n.beat.born)), 1))
}

// CutOff reports whether this node has been out of touch with the
// controller for SelfFenceAfter: no Raft contact, or no heartbeat sent
// that long ago counted. Its Leaders stopped committing at the first
// (HearsController); from here on it refuses new appends to the streams
// it leads and /readyz fails, so clients go to another node. A blip, a
// controller's election, does not refuse: appends wait for it.
func (n *Node) CutOff() bool {
	if n.IsController() {
		return false
	}
	limit := rules.SelfFenceAfter(n.cfg.SessionTimeout)
	if time.Since(n.raft.LastContact()) >= limit {
		return true
	}
	return n.beat.needed.Load() && n.sinceCounted() >= limit
}

// sinceCounted is how long ago this node sent the last heartbeat the
// controller counted; before the first, how long ago it started.
func (n *Node) sinceCounted() time.Duration {
	return time.Since(n.beat.born) - time.Duration(n.beat.acked.Load())
}

// sessionHeld reports, on a broker, whether the controller counted a
// heartbeat it sent less than SelfFenceAfter ago; true while the
// controller it knows does not count heartbeats.
func (n *Node) sessionHeld() bool {
	if !n.beat.needed.Load() {
		return true
	}
	// None counted yet: not held (CutOff gives a new node its start's grace).
	return n.beat.acked.Load() != 0 && n.sinceCounted() < rules.SelfFenceAfter(n.cfg.SessionTimeout)
}
