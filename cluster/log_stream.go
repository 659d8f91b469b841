package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// The produce path, from here and forward.go (the follower's side)
// and forward_server.go (the leader's).
//
// A producer may use any node that holds a replica of the stream. On the
// stream's leader (where the Replicator runs its Leader) an append is
// taken only while the ISR has min_insync_replicas members, else refused
// with mqtt.ErrNotEnoughReplicas (MQTT reason 0x97); it is written
// locally (the store runs with ManualCommit, so that only means written),
// and its done is called, in call order, by the stream's goroutine once
// the high watermark has passed it, that is once the ISR holds it. If
// leadership moves first it is refused with ErrLeaderUnavailable (0x80,
// "stream leader unavailable"), if the ISR falls below the minimum with
// ErrNotEnoughReplicas; the records may still commit under the next
// leader, so a producer's retry can duplicate them (at least once). A
// Leader admits appends until Close (or a hand-over's Drain) begins and
// Close waits until those are written: no record of an ended leadership
// lands after the Fetcher that follows it truncated the log. An append
// that reaches the node the state has just named leader, before its
// Replicator has started the Leader, or forwarded in a leader epoch this
// node's state does not have yet, waits for it (admitOrHoldLocked), for
// at most leaderStartWait, with every later append behind it.
//
// On a follower, AppendAsync forwards (forward.go): the records
// (forward_codec.go: the producer's fields; a zero timestamp is stamped
// here, with this node's clock) go to the leader the state names, at its
// Serf-advertised cluster address, dialled with the Node's dialer (cluster
// TLS applies), as ProduceRequest frames on one connection per stream and
// leader epoch. The connection is a pipeline: a writer sends each append
// as soon as it is made while at most fwdWindow are unanswered, the
// leader's Server reads them without waiting, hands each to its stream's
// local append in arrival order (so call order on this node is append
// order on the leader), and writes the answers in the same order, each
// naming its sequence number. The leader answers as it would answer its
// own producer; the follower calls done with the leader's first offset
// once its own watermark has passed the records too (so a reader on this
// node sees what was acknowledged here; after fwdLocalWait, 2 s, a
// replica that stopped fetching answers anyway). Refusals come back typed:
// NotEnoughReplicas as mqtt.ErrNotEnoughReplicas, RecordTooLarge and
// NoSpace as logstore's ErrRecordTooLarge and ErrNoSpace (so MQTT gives
// the reason codes a single node gives), NotLeader and stale epochs as
// ErrLeaderUnavailable. Each append sent must be answered within
// LogConfig.ForwardTimeout (4 s) of its sending (answers to others do not
// extend it). Past that, or when the connection fails, the connection is
// dropped: the appends sent on it and unanswered are refused with an
// mqtt.Refusal of ErrLeaderUnavailable whose reason says the message may
// be stored and to publish again, and those not yet sent go on a new
// connection, dialled at once. When the state names another leader or
// epoch, or the leader cannot be dialled, every append unanswered is
// refused (those never sent were not stored). The old leader may still
// commit some of the refused (at least once), but done(nil) is only ever
// called on the leader's word that the records are committed, so an
// acknowledged record is in the ISR and survives on whichever replica the
// controller elects.
//
// acks=leader.
//
// LogConfig.AcksLeader names the streams that are acks=leader: their
// leader answers an append, its own or forwarded, once written locally
// (not waiting for the ISR), min_insync_replicas does not refuse it, and
// a forwarding follower answers on the leader's word without waiting for
// its own watermark. Such an answer is given before the records are
// committed: a leader that dies can lose them, and Committed may still be
// below them when done runs. Consumer-state writes of such a stream are
// answered once the leader wrote them, too. A graceful stop of the
// leader loses neither: it drains first (site.go).
//
// Reads, Committed and Changed serve the committed records of this node's
// replica, on every replica; Changed is forwarded from the store's (the
// forwarder takes the store's next channel before it tells, so no
// advance is missed).

// stream is one visible stream of a Log: this node's replica, appended to
// locally while this node's Replicator leads it, else through the leader
// (forward.go).
//
// Its goroutine answers appends in call order (each once the high
// watermark passed it, or refused), forwards the replica's Changed,
// notices this node becoming the leader (StateMoved), ends
// a forwarder whose leader is no longer the state's, and runs the
// follower side of consumer-state replication (log_state_follower.go).
//
// Its parts own their locks: forwarding (fwd: forward.go), claims
// (log_claims.go), the mirror queue (log_mirror.go), consumer-state
// replication (rs, fs: log_state_*.go);
// on SessionsStream, the adoption of orphaned sessions (orphans,
// log_sessions_orphaned.go) decides under the claims' locks.
// Lock order: claims.op, claims.dec, mu, then rs.mu, mirrorQ.mu or
// fwd.mu (then its forwarder's mu); claims.mu is taken alone.
type stream struct {
	l    *Log
	st   *logstore.Stream
	name string

	kick chan struct{} // cap 1: an append was written or queued
	stop chan struct{} // closed by close
	done chan struct{} // the goroutine ended; every append answered

	mu struct {
		sync.Mutex
		pending []*pendingAppend // call order
		closed  bool
		changed chan struct{}
		moved   chan struct{}
		leader  *Leader // the Leader last seen
		// gaveUp: closing gave up a written append; every later one is
		// given up too, or a later append told committed would follow an
		// earlier one told it failed.
		gaveUp bool
		// recheck is when run looks again (zero: no need): at the head of
		// the queue waiting on this node's leadership (a leader cut off
		// from the controller gives it up then), or at held appends.
		recheck time.Time
		// held are appends waiting, in call order, for this node's
		// Leader: the state names it leader and the Replicator has not
		// started it yet (release).
		held []heldAppend
		// heldEpoch is the newest leader epoch a held append was
		// forwarded in (0: none).
		heldEpoch uint32
	}
	stopOnce  sync.Once
	fwd       forwarding     // appends to the leader, while another node leads (forward.go)
	seen      fwdProducers   // the forwards received, while leader (forward_dedup.go)
	mirrorRun sync.WaitGroup // mirrorWriter, while it runs (log_mirror.go)
	rpc       rpcConn        // forwarded state writes
	rs        replState      // consumer-state versions, while leader
	fs        followState    // consumer-state replication, while follower

	claims  *claims      // its group claims (log_claims.go)
	orphans *orphans     // SessionsStream's adoption of orphaned sessions (log_sessions_orphaned.go); nil on others
	mirrorQ *mirrorQueue // mirror appends on their way to the mirror rules (log_mirror.go)
}

// pendingAppend is one AppendAsync call until its done is called.
type pendingAppend struct {
	done   func(uint64, error)
	held   bool         // not admitted yet: in mu.held
	at     time.Time    // when it was admitted to this node's leadership
	late   bool         // admitted while that leadership could not commit (!Current)
	leader *Leader      // nil: forwarded, or refused at once with err
	fwd    bool         // forwarded to the leader: res is its answer
	err    error        // the refusal when neither
	res    atomic.Value // appendResult, once the replica wrote it or refused
}

type appendResult struct {
	first, end uint64
	err        error
	at         time.Time // when a forwarded append was answered
}

var _ mqtt.Stream = (*stream)(nil)

func newStream(l *Log, st *logstore.Stream) *stream {
	s := &stream{l: l, st: st, name: st.Name(), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.mu.changed = make(chan struct{})
	s.mu.moved = make(chan struct{})
	s.mu.leader = s.leading()
	s.claims = newClaims(s)
	s.mirrorQ = newMirrorQueue()
	s.rs.s, s.rs.changed = s, make(chan struct{})
	s.rs.reset(s.mu.leader)
	s.fs.s, s.fs.stop = s, make(chan struct{})
	s.fwd.s = s
	s.seen.keep = max(fwdSeenFor, 2*l.forwardTimeout())
	go s.run(st.Changed()) // taken before Changed can be called: no advance is missed
	go s.claims.repair()
	if s.name == SessionsStream {
		s.orphans = newOrphans(s)
		go s.orphans.watch()
	}
	return s
}

// leading is the Leader this node runs for the stream's replica, nil when
// it does not lead it.
func (s *stream) leading() *Leader {
	ld, _ := s.l.rep.Leading(s.name)
	if ld == nil || ld.Stream() != s.st {
		return nil
	}
	return ld
}

func (s *stream) Name() string      { return s.name }
func (s *stream) Filters() []string { return s.st.Filters() }

// AppendAsync appends on the stream's leader and calls done once the
// in-sync replicas hold the records (the high watermark passed them), or,
// under acks=leader, once the leader wrote them. On a replica that does
// not lead the stream, the records go to the leader (forward.go) and
// done is called with the leader's answer, once this replica's watermark
// has passed them too (acks=all), so that a reader here sees them.
// It refuses, in call order, with mqtt.ErrLeaderUnavailable when no
// leader is known or reachable, or leadership moves before the records
// commit, and with mqtt.ErrNotEnoughReplicas while the ISR is below
// min_insync_replicas. A refused append may still have been written, and
// be committed later by a new leader: the producer's retry then
// duplicates it (at least once, as Kafka's producers without
// idempotence).
func (s *stream) AppendAsync(recs []*logstore.Record, done func(first uint64, err error)) {
	s.appendAsync(recs, done, true, 0)
}

// appendForwarded is the leader's side of a follower's forwarded append,
// made in the leader epoch the follower believes in.
func (s *stream) appendForwarded(epoch uint32, recs []*logstore.Record, done func(first uint64, err error)) {
	if ld := s.leading(); ld != nil && ld.epoch != epoch {
		done(0, wrongEpoch("append to", s.name, epoch, ld))
		return
	}
	s.appendAsync(recs, done, false, epoch)
}

func wrongEpoch(what, stream string, epoch uint32, ld *Leader) error {
	return fmt.Errorf("cluster: %s %s: forwarded in leader epoch %d, this leader runs %d: %w", what, stream, epoch, ld.epoch, mqtt.ErrLeaderUnavailable)
}

var errNotLeaderHere = fmt.Errorf("cluster: this node does not lead the stream: %w", mqtt.ErrLeaderUnavailable)

// What a producer is told when this node leads a stream it cannot commit
// to: it lost the controller (or was deposed and has not heard yet).
// errCutOff refuses a new append; errFateUnknown gives up one written
// that could not commit within cluster.session_timeout, or, taken when
// the leader already could not commit, before the node was cut off (it
// may still commit, if the node is back in time: publish again, at least
// once).
var (
	errCutOff = mqtt.Refuse("the stream's leader is cut off from the site's controller: publish through another node",
		mqtt.ErrLeaderUnavailable)
	errFateUnknown = mqtt.Refuse("the stream's leader lost the site's controller before the message committed; "+
		"it may or may not be stored: publish again, through another node", mqtt.ErrLeaderUnavailable)
)

// appendAsync is AppendAsync (forward: another node's leadership takes
// the records through forwarding) and, with forward false, the leader's
// side of a follower's append forwarded in leader epoch epoch.
func (s *stream) appendAsync(recs []*logstore.Record, done func(first uint64, err error), forward bool, epoch uint32) {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		done(0, fmt.Errorf("cluster: append to %s: %w", s.name, logstore.ErrClosed))
		return
	}
	p := &pendingAppend{done: done}
	s.mu.pending = append(s.mu.pending, p)
	if s.st.Mirror() && s.name != SessionsStream {
		// Its offsets are its source's (mirrorAsync): mqtt routes no
		// publish here, and a forwarded one is refused too.
		p.err = fmt.Errorf("cluster: append to %s: %w", s.name, ErrNotMirror)
	} else {
		s.admitOrHoldLocked(p, forwardedIn(forward, epoch), func(ld *Leader) { s.admitAppendLocked(p, ld, recs, forward, epoch) })
	}
	s.mu.Unlock()
	s.wake()
}

// forwardedIn is the leader epoch an append was forwarded in, 0 for
// this node's own (forward: it goes to whoever leads).
func forwardedIn(forward bool, epoch uint32) uint32 {
	if forward {
		return 0
	}
	return epoch
}

// admitAppendLocked sends p's records where admitLocked decides, under
// mu, so that they go in call order.
func (s *stream) admitAppendLocked(p *pendingAppend, ld *Leader, recs []*logstore.Record, forward bool, epoch uint32) {
	if !forward && ld != nil && ld.epoch != epoch { // it waited for a Leader of another epoch
		p.err = wrongEpoch("append to", s.name, epoch, ld)
		return
	}
	fr := s.admitLocked(p, ld, "append to", forward, recs)
	switch {
	case p.leader != nil:
		// The replica's done may run at once (a closed store): it takes
		// no lock of ours.
		n := uint64(len(recs))
		s.st.AppendAsync(recs, func(first uint64, err error) {
			ld.endAppend()
			s.settle(p, appendResult{first: first, end: first + n, err: err})
		})
	case p.fwd:
		s.fwd.send(fr, "append to")
	}
}

// leaderStartWait bounds how long an append waits for this node's
// Leader once the state names the node leader (admitOrHoldLocked): the
// Replicator starts it within milliseconds of the state's change, after
// ending the role it had; a longer wait means something else holds it
// (the node restarted and is not registered yet), and the append is
// refused as it would have been at once.
const leaderStartWait = 2 * time.Second

// heldAppend is an append waiting for this node's Leader (admitOrHoldLocked).
type heldAppend struct {
	p     *pendingAppend
	until time.Time
	admit func(ld *Leader) // admitAppendLocked or the mirror's, under mu
}

// admitOrHoldLocked admits p now, with this node's Leader if it runs
// one, or holds it while no Leader runs here yet and either the state
// names this node the stream's leader, or p was forwarded in a leader
// epoch (forwardedIn, 0 for this node's own) newer than the state here
// has yet (the controller's entry reached the follower first), or
// earlier appends are held (call order): release admits them once the
// Leader runs. Without the hold, a producer that reaches a just-elected
// leader in its first milliseconds, directly or through another node,
// would be refused (an MQTT 3.1.1 client disconnected) for nothing.
func (s *stream) admitOrHoldLocked(p *pendingAppend, forwardedIn uint32, admit func(*Leader)) {
	if len(s.mu.held) == 0 {
		if ld := s.leading(); ld != nil {
			admit(ld)
			return
		}
		if !s.awaitsLeadership(forwardedIn) {
			admit(nil)
			return
		}
	}
	p.held = true
	until := time.Now().Add(leaderStartWait)
	s.mu.held = append(s.mu.held, heldAppend{p: p, until: until, admit: admit})
	s.mu.heldEpoch = max(s.mu.heldEpoch, forwardedIn)
	s.recheckLocked(until)
}

// awaitsLeadership, while no Leader runs here: the state names this
// node the stream's leader, or is older than epoch (a leader epoch a
// follower forwarded in).
func (s *stream) awaitsLeadership(epoch uint32) bool {
	id, have := s.stateLeaderID()
	return id == s.l.node.ID() || have < epoch
}

// release admits the held appends, in call order, once this node runs
// the stream's Leader, the state names another leader, or the first has
// waited leaderStartWait; admitted with no Leader here, they are
// forwarded or refused as they would have been at once. A closed stream
// refuses them (ErrClosed).
func (s *stream) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.mu.held) == 0 {
		return
	}
	ld := s.leading()
	if ld == nil && s.awaitsLeadership(s.mu.heldEpoch) && !s.mu.closed && time.Now().Before(s.mu.held[0].until) {
		s.recheckLocked(s.mu.held[0].until)
		return
	}
	held := s.mu.held
	s.mu.held, s.mu.heldEpoch = nil, 0
	for _, h := range held {
		h.p.held = false
		if s.mu.closed { // nothing is written once closing began
			h.p.err = fmt.Errorf("cluster: append to %s: %w", s.name, logstore.ErrClosed)
			continue
		}
		h.admit(ld)
	}
}

// recheckLocked makes run look again by at.
func (s *stream) recheckLocked(at time.Time) {
	if s.mu.recheck.IsZero() || at.Before(s.mu.recheck) {
		s.mu.recheck = at
	}
}

// admitLocked decides, under mu, where p goes: to ld, this node's
// leadership (p.leader), forwarded to the leader (forward true and no
// leadership here: the returned request, p.fwd), or nowhere (p.err). what
// names the call in errors ("append to", "mirror").
func (s *stream) admitLocked(p *pendingAppend, ld *Leader, what string, forward bool, recs []*logstore.Record) *fwdReq {
	var fr *fwdReq
	switch {
	case ld == nil && forward:
		fr, p.err = newFwdReq(what, s.name, recs)
		if p.err == nil {
			p.fwd, fr.p = true, p
		}
	case ld == nil:
		p.err = fmt.Errorf("cluster: %s %s: %w", what, s.name, errNotLeaderHere)
	case !s.l.acksLeader(s.name) && !ld.InSync():
		p.err = fmt.Errorf("cluster: %s %s: %w", what, s.name, mqtt.ErrNotEnoughReplicas)
	case s.l.node.CutOff():
		// Cut off from the controller for a while, not a blip: it cannot
		// commit, and its producers are better off on another node.
		p.err = fmt.Errorf("cluster: %s %s: %w", what, s.name, errCutOff)
	case !ld.beginAppend():
		p.err = fmt.Errorf("cluster: %s %s: leadership ending: %w", what, s.name, mqtt.ErrLeaderUnavailable)
	default:
		p.leader, p.at, p.late = ld, time.Now(), !ld.Current()
	}
	return fr
}

// stateLeader is the stream's leader as this node's copy of the
// controller's state names it, with its leader epoch and cluster address.
func (s *stream) stateLeader() (id string, epoch uint32, addr string) {
	id, epoch = s.stateLeaderID()
	if id == "" {
		return "", 0, ""
	}
	return id, epoch, s.l.node.memberAddr(id)
}

// stateLeaderID is stateLeader without the address (a look at Serf's
// member list).
func (s *stream) stateLeaderID() (id string, epoch uint32) {
	if cs := s.l.node.View().Streams[s.name]; cs != nil {
		return cs.Leader, cs.LeaderEpoch
	}
	return "", 0
}

// settle records an append's outcome and wakes the goroutine that answers.
func (s *stream) settle(p *pendingAppend, r appendResult) {
	p.res.Store(r)
	s.wake()
}

func (s *stream) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run answers appends and forwards Changed until close; then it answers
// what is still pending.
func (s *stream) run(u <-chan struct{}) {
	defer close(s.done)
	defer s.fs.end()
	recheck := time.NewTimer(time.Hour)
	defer recheck.Stop()
	for {
		_, repChanged := s.l.rep.Leading(s.name) // before looking: a change from now on closes it
		ld := s.noteLeader()
		s.fwd.check()
		s.release()
		s.fs.follow(ld)
		s.answer(ld, false)
		s.mu.Lock()
		if at := s.mu.recheck; !at.IsZero() {
			s.mu.recheck = time.Time{}
			recheck.Reset(max(time.Until(at), time.Millisecond))
		}
		s.mu.Unlock()
		select {
		case <-recheck.C:
		case <-s.stop:
			s.drain()
			return
		case <-u:
			u = s.st.Changed() // before telling: an advance from now on closes it
			s.mu.Lock()
			close(s.mu.changed)
			s.mu.changed = make(chan struct{})
			s.mu.Unlock()
			if streamClosed(s.st) { // the store closed it; the Log removes it
				<-s.stop
				s.drain()
				return
			}
		case <-repChanged:
		case <-s.kick:
		}
	}
}

// noteLeader fires StateMoved when this node has become the stream's
// leader (mqtt reloads the state this leader now serves), and starts the
// consumer-state versions of the new leadership.
//
// Whoever looks first (run, Claim, StateMoved) notes the change, under mu
// and from the Replicator's current answer, so a stale look never undoes
// a newer one.
func (s *stream) noteLeader() *Leader {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.noteLeaderLocked()
}

func (s *stream) noteLeaderLocked() *Leader {
	ld := s.leading()
	if ld == s.mu.leader {
		return ld
	}
	if ld != nil {
		close(s.mu.moved)
		s.mu.moved = make(chan struct{})
	}
	s.mu.leader = ld
	s.rs.reset(ld)
	return ld
}

// answer calls done for the appends at the head of the queue that are
// settled: committed, refused, or, under a leader no longer current (or
// below min_insync_replicas), given up. closing gives up the rest of the
// written ones with ErrClosed.
func (s *stream) answer(ld *Leader, closing bool) (empty bool) {
	var calls []answerCall
	s.mu.Lock()
	// One look at the watermark for the whole queue: it moves on other
	// goroutines, and a later append answered as committed after an
	// earlier one was given up (closing) would leave a gap. drain calls
	// this again as the rest are written: gaveUp carries the give-up over.
	committed := s.st.Committed()
	for len(s.mu.pending) > 0 {
		p := s.mu.pending[0]
		if p.held {
			break // release admits it
		}
		c := answerCall{done: p.done, err: p.err}
		if p.fwd {
			r, ok := p.res.Load().(appendResult)
			if !ok {
				break // not answered yet
			}
			switch {
			case r.err != nil:
				c.err = r.err
			case !s.mu.gaveUp && (r.end <= committed || s.l.acksLeader(s.name) || time.Since(r.at) > fwdLocalWait):
				c.first = r.first // the run loop looks at least every replicatorRetry
			case closing:
				c.err = fmt.Errorf("cluster: append to %s: %w", s.name, logstore.ErrClosed)
				s.mu.gaveUp = true
			default:
				// Committed on the leader: answered once this replica's
				// watermark has caught up, so a reader here sees it.
				s.mu.Unlock()
				s.call(calls)
				return false
			}
		} else if p.leader != nil {
			r, ok := p.res.Load().(appendResult)
			if !ok {
				break // not written yet
			}
			switch {
			case r.err != nil:
				c.err = r.err
			case !s.mu.gaveUp && (r.end <= committed || s.l.acksLeader(s.name)):
				c.first = r.first
			case closing:
				c.err = fmt.Errorf("cluster: append to %s: %w", s.name, logstore.ErrClosed)
				s.mu.gaveUp = true
			case p.leader != ld:
				c.err = fmt.Errorf("cluster: append to %s: leadership moved before the records committed: %w", s.name, mqtt.ErrLeaderUnavailable)
			case !ld.InSync():
				c.err = fmt.Errorf("cluster: append to %s: the ISR fell below min_insync_replicas: %w", s.name, mqtt.ErrNotEnoughReplicas)
			case !ld.Current() && s.l.givesUp(p.at, p.late):
				// It cannot commit, and it waited a whole session (the
				// controller has deposed this leader by now, or is about
				// to), or it came when the leader already could not commit
				// and the node is now cut off (refusing new appends): a
				// producer that moved here during a failover. One taken
				// while the leader could commit waits out a controller
				// election longer than the cut-off, as before.
				c.err = fmt.Errorf("cluster: append to %s: %w", s.name, errFateUnknown)
			default:
				// Waiting for the ISR. Nothing else wakes this loop when the
				// leader loses the controller: look again when the session
				// timeout has passed, and every quarter of it after; while
				// this leader cannot commit, every eighth, to give up once
				// the node is cut off.
				timeout := s.l.node.cfg.SessionTimeout
				at := later(p.at.Add(timeout), time.Now().Add(timeout/4))
				if !ld.Current() {
					at = time.Now().Add(timeout / 8)
				}
				s.recheckLocked(at)
				s.mu.Unlock()
				s.call(calls)
				return false
			}
		}
		calls = append(calls, c)
		s.mu.pending = s.mu.pending[1:]
	}
	empty = len(s.mu.pending) == 0
	s.mu.Unlock()
	s.call(calls)
	return empty
}

// givesUp is whether a write a leader took at at, when it could (late
// false) or could not commit, is given up now that it cannot: a session
// after it was taken, or, taken late, once the node is cut off. Appends
// (answer) and state writes (replState.await) follow it alike.
func (l *Log) givesUp(at time.Time, late bool) bool {
	return time.Since(at) >= l.node.cfg.SessionTimeout || late && l.node.CutOff()
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// answerCall is one done call, made outside mu (done may append again).
type answerCall struct {
	done  func(uint64, error)
	first uint64
	err   error
}

func (s *stream) call(calls []answerCall) {
	for _, c := range calls {
		c.done(c.first, c.err)
	}
}

// drain answers every pending append after close: each is written or
// refused by the replica soon (its appender runs until the store closes).
func (s *stream) drain() {
	s.mu.Lock()
	close(s.mu.changed) // stays closed: Changed of a closed stream never blocks
	s.mu.Unlock()
	s.fwd.end() // its appends are answered ErrLeaderUnavailable
	s.release() // closed: the held ones are refused
	for !s.answer(nil, true) {
		<-s.kick
	}
	s.fwd.wg.Wait()
	s.mirrorRun.Wait()
	<-s.claims.done
	if s.orphans != nil {
		<-s.orphans.done
	}
	s.rpc.close()
	s.claims.rpc.close()
}

// close makes the stream behave as closed (appends, reads and state fail
// with ErrClosed, Changed is closed) and stops its goroutine once every
// pending append is answered; idempotent. Wait on done.
func (s *stream) close() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.mu.closed = true
		s.mirrorQ.close()
		s.mu.Unlock()
		close(s.stop)
	})
}

func (s *stream) closedErr(what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("cluster: %s %s: %w", what, s.name, logstore.ErrClosed)
	}
	return nil
}

// Read serves committed records, on every replica.
func (s *stream) Read(from uint64, max, maxBytes int) ([]*logstore.Record, error) {
	if err := s.closedErr("read"); err != nil {
		return nil, err
	}
	return s.st.Read(from, max, maxBytes)
}

func (s *stream) OffsetForTime(t time.Time) (uint64, error) {
	if err := s.closedErr("offset for time in"); err != nil {
		return 0, err
	}
	return s.st.OffsetForTime(t)
}

func (s *stream) FirstOffset() uint64 { return s.st.FirstOffset() }
func (s *stream) Committed() uint64   { return s.st.Committed() }

// Changed closes at the next advance of the replica's watermark (or other
// change of it), or when the stream closes.
func (s *stream) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.changed
}

// WriteState writes the stream's consumer state through its leader
// (log_state_leader.go): on the leader, into its store, answered once the ISR
// holds it; elsewhere forwarded to the leader. Keys the leader refuses
// because another node holds their sessions (writeStateFrom) are dropped
// and the rest written, as mqtt drops its own writes of a session it
// knows moved; this node learns of the move itself from its replica of
// the sessions' stream (claims.moved).
func (s *stream) WriteState(puts map[string][]byte, dels []string) error {
	for k := range puts {
		if strings.HasPrefix(k, claimStatePrefix) {
			return fmt.Errorf("cluster: write state of %s: key %q is reserved for claims", s.name, k)
		}
	}
	for _, k := range dels {
		if strings.HasPrefix(k, claimStatePrefix) {
			return fmt.Errorf("cluster: write state of %s: key %q is reserved for claims", s.name, k)
		}
	}
	for {
		err := s.writeStateOnce(puts, dels)
		moved, ok := errors.AsType[*movedError](err)
		if !ok {
			return err
		}
		n := len(puts) + len(dels)
		puts, dels = withoutKeys(puts, dels, moved.keys)
		if len(puts)+len(dels) == n {
			return err // the leader named none of them: not to be retried here
		}
		s.l.log.Debug("cluster: dropped state writes of sessions another node holds", slog.String("stream", s.name), slog.Any("keys", moved.keys))
		if len(puts)+len(dels) == 0 {
			return nil
		}
	}
}

// writeStateOnce is one try of WriteState, on the leader or forwarded.
func (s *stream) writeStateOnce(puts map[string][]byte, dels []string) error {
	if err := s.closedErr("write state of"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	go func() { // close ends a wait for the ISR
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		if ld := s.noteLeader(); ld != nil {
			return s.writeStateFrom(ctx, ld, puts, dels, stateFrom{s.l.node.ID(), s.l.node.Epoch()})
		}
		if err := s.forwardStateWrite(ctx, puts, dels); err != errLeaderMoved {
			return err
		}
		s.l.log.Debug("cluster: state write sent again to the stream's new leader", slog.String("stream", s.name))
		s.awaitLeading(ctx)
	}
}

// LoadState reads this node's copy of the stream's consumer state: the
// leader's own, or what a follower has replicated from it. Claims are
// the cluster's own entries: they are left out.
func (s *stream) LoadState(prefix string, fn func(key string, val []byte) error) error {
	if err := s.closedErr("load state of"); err != nil {
		return err
	}
	if strings.HasPrefix(claimStatePrefix, prefix) {
		inner := fn
		fn = func(k string, v []byte) error {
			if strings.HasPrefix(k, claimStatePrefix) {
				return nil
			}
			return inner(k, v)
		}
	}
	return s.st.LoadState(prefix, fn)
}

// StateMoved closes when this node becomes the stream's leader.
func (s *stream) StateMoved() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteLeaderLocked() // a move already made closes the channel the caller held, not this one
	return s.mu.moved
}
