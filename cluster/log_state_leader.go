package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/mqtt"
)

// Consumer-state replication, the leader's side (the follower's is
// log_state_follower.go).
//
// Group offsets and session positions (Stream.WriteState) are the
// stream's, and follow Kafka's __consumer_offsets: written by the leader,
// replicated to the ISR, answered once the ISR holds them.
//
//   - On the leader, WriteState writes its store and gives the write the
//     next version (leader epoch, seq); its latest writes, up to
//     stateLogMax (4096) keys, are kept in memory as changes.
//   - On a follower, WriteState is forwarded to the leader (a
//     StateWriteRequest) and answered with the leader's answer; sent
//     again to the next leader when the state names another before the
//     first answered (whileLeads), or after a deposed leader answered
//     "not the leader" (movedOn), as a claim is.
//   - Every follower runs one more long poll per stream, a
//     StateFetchRequest naming the version it holds: the leader counts it
//     as that follower's acknowledgement, and answers with the changes
//     since (merged), with its whole state (Reset) when the version is of
//     another leader epoch or older than the kept changes, or, when there
//     is nothing new, after up to 500 ms. The follower writes the answer
//     into its store (a Reset also deletes the keys the leader lacks) and
//     asks again.
//   - The leader answers a write once every other ISR member has
//     acknowledged its seq (about one round trip), or refuses it:
//     ErrNotEnoughReplicas below min_insync_replicas or when the ISR has
//     not acknowledged it within 15 s, ErrLeaderUnavailable if leadership
//     moves meanwhile. A leader cut off from the controller refuses new
//     writes, and gives up those waiting as it gives up appends
//     (stream.answer): within cluster.session_timeout, or at the cut-off
//     for one taken when it already could not commit. mqtt's state
//     writer, one per node, retries failed writes: a write held here
//     holds every group and session of the node.
//
// A new leader comes from the ISR, so it holds every state write that was
// answered, and a group offset never points past its log: consumers are
// given committed records only, which every ISR member holds. StateMoved
// fires when this node becomes the leader, and mqtt loads the state again
// (it does not fire on followers as they apply the leader's changes:
// their consumers write through the leader and keep their own positions).
// A replica outside the ISR is taken back (Leader.Joiners) only once it
// has acknowledged the leader's latest state version as well as caught
// up with its records, so whoever the controller can elect holds every
// answered write. What a failover can lose: writes not yet answered
// (consumers then re-read from the previous position: at least once),
// and with acks=leader what the dead leader had answered. A follower
// restarting, or meeting a new leader, gets the
// whole state again; a Reset larger than logstore.MaxStateWrite entries
// is written in several steps, so a crash part way leaves a mix of the
// old and the new state on that follower until its next fetch.
//
// Log.State is this node's store's, not replicated; durable sessions
// are the site's (log_sessions.go).

// stateLogMax is how many entries (keys put or deleted) of its recent
// state writes a leader keeps to send a follower as changes; one further
// behind gets the whole state.
const stateLogMax = 4096

// replState is a leader's consumer-state versions: every write it makes
// in its leadership (leader, epoch) gets the next seq, the recent ones
// are kept as changes, and each follower's state fetch acknowledges the
// seq it holds.
type replState struct {
	s      *stream // whose state it replicates
	mu     sync.Mutex
	leader *Leader
	epoch  uint32
	seq    uint64
	log    []stateChange // the last writes, seq order
	// logKeys counts the entries in log.
	logKeys int
	acked   map[string]uint64
	// served is the seq each follower was last brought to; caught, that
	// its last fetch acknowledged the seq it was served before (it keeps
	// up: a rule that waited for the latest seq would never let a
	// follower back while consumers commit all the time).
	served  map[string]uint64
	caught  map[string]bool
	changed chan struct{} // closed when seq or an ack grows
}

type stateChange struct {
	seq  uint64
	puts map[string][]byte
	dels []string
}

// reset starts the versions of a new leadership (nil: none), and has its
// Leader take a replica back into the ISR only once it holds the state.
func (r *replState) reset(ld *Leader) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leader == ld {
		return
	}
	r.leader, r.seq, r.log, r.logKeys, r.acked = ld, 0, nil, 0, nil
	r.served, r.caught = map[string]uint64{}, map[string]bool{}
	if ld != nil {
		r.epoch = ld.epoch
		ld.setJoinable(func(id string) bool { return r.holds(ld, id) })
	}
	r.notifyLocked()
}

// holds reports whether replica id keeps up with the state writes of
// leadership ld: its last fetch acknowledged what it was served before.
func (r *replState) holds(ld *Leader, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leader == ld && r.caught[id]
}

func (r *replState) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// stateWait is what a state write on the leader waits for.
type stateWait int

const (
	// waitAcks follows the stream's acks: acks=all refuses below
	// min_insync_replicas and waits for the ISR, acks=leader does neither.
	waitAcks stateWait = iota
	// waitISR waits for the ISR whatever the acks (claims: a new leader
	// must hold every claim answered), refusing below min_insync_replicas
	// only under acks=all.
	waitISR
	// waitNone writes locally only (taking back an unanswered claim).
	waitNone
)

// writeStateLeader writes on the leader ld: into the store under the
// next seq, then, unless the stream is acks=leader, waits until every
// other ISR member has acknowledged that seq (its next state fetch), so
// a new leader, which comes from the ISR, holds every write answered.
func (s *stream) writeStateLeader(ctx context.Context, ld *Leader, puts map[string][]byte, dels []string) error {
	return s.rs.write(ctx, ld, puts, dels, waitAcks)
}

// write is writeStateLeader with what to wait for.
func (r *replState) write(ctx context.Context, ld *Leader, puts map[string][]byte, dels []string, w stateWait) error {
	taken := takenBy(ld)
	seq, err := r.stage(ld, puts, dels, w)
	if err != nil {
		return err
	}
	return r.await(ctx, ld, seq, w, taken)
}

// stateTaken is when a leader took a state write, and whether it could
// not commit then (Leader.Current): await gives the write up by
// Log.givesUp, as appends are. The zero value is never given up.
type stateTaken struct {
	at   time.Time
	late bool
}

func takenBy(ld *Leader) stateTaken { return stateTaken{at: time.Now(), late: !ld.Current()} }

// What a state write on a leader cut off from the controller is told;
// see errCutOff and errFateUnknown, their appends' counterparts.
var (
	errStateCutOff = mqtt.Refuse("the stream's leader is cut off from the site's controller: "+
		"its consumer state cannot be written there", mqtt.ErrLeaderUnavailable)
	errStateFateUnknown = mqtt.Refuse("the stream's leader lost the site's controller before its replicas "+
		"held the consumer state written; it may or may not be kept", mqtt.ErrLeaderUnavailable)
)

// stage writes into the leader ld's store under the next seq, which
// it returns: what await then waits for the ISR to acknowledge.
// Split so that a fenced write (writeStateFrom) holds claims.dec while it
// is written, not while the ISR acknowledges it.
func (r *replState) stage(ld *Leader, puts map[string][]byte, dels []string, w stateWait) (uint64, error) {
	if r.checksMin(w) && !ld.InSync() {
		return 0, fmt.Errorf("cluster: write state of %s: %w", r.s.name, mqtt.ErrNotEnoughReplicas)
	}
	if w != waitNone && r.s.l.node.CutOff() {
		return 0, fmt.Errorf("cluster: write state of %s: %w", r.s.name, errStateCutOff)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leader != ld {
		return 0, fmt.Errorf("cluster: write state of %s: leadership moved: %w", r.s.name, mqtt.ErrLeaderUnavailable)
	}
	// Under r.mu, so that drain's seq counts every write let through.
	if w != waitNone && ld.draining() {
		return 0, fmt.Errorf("cluster: write state of %s: leadership ending: %w", r.s.name, mqtt.ErrLeaderUnavailable)
	}
	if err := r.s.st.WriteState(puts, dels); err != nil {
		return 0, err
	}
	r.seq++
	c := stateChange{seq: r.seq, puts: make(map[string][]byte, len(puts)), dels: slices.Clone(dels)}
	for k, v := range puts {
		c.puts[k] = slices.Clone(v) // the caller may reuse its values
	}
	r.log = append(r.log, c)
	r.logKeys += len(c.puts) + len(c.dels)
	for r.logKeys > stateLogMax && len(r.log) > 1 {
		r.logKeys -= len(r.log[0].puts) + len(r.log[0].dels)
		r.log = r.log[1:]
	}
	r.notifyLocked()
	return r.seq, nil
}

// checksMin reports whether a write waiting for w is refused below
// min_insync_replicas.
func (r *replState) checksMin(w stateWait) bool {
	return !r.s.l.acksLeader(r.s.name) && w != waitNone
}

// await waits, unless w or the stream's acks say not to, until
// every other ISR member of the leader ld has acknowledged seq, or, for
// a write taken (not zero) while ld cannot commit, until it gives up.
func (r *replState) await(ctx context.Context, ld *Leader, seq uint64, w stateWait, taken stateTaken) error {
	if w != waitISR && (w != waitAcks || r.s.l.acksLeader(r.s.name)) {
		return nil
	}
	checkMin := r.checksMin(w)
	session := r.s.l.node.cfg.SessionTimeout
	// Nothing else wakes the wait when this node loses the controller:
	// while ld cannot commit, look again every eighth of a session.
	var recheck *time.Timer
	defer func() {
		if recheck != nil {
			recheck.Stop()
		}
	}()
	for {
		st, stChanged := r.s.l.node.Watch() // read only: no copy per look
		r.mu.Lock()
		changed := r.changed
		held := true
		if cs := st.Streams[r.s.name]; cs != nil {
			for _, id := range cs.ISR {
				if id != r.s.l.node.ID() && r.acked[id] < seq {
					held = false
				}
			}
		}
		r.mu.Unlock()
		switch {
		case r.s.leading() != ld:
			return fmt.Errorf("cluster: write state of %s: leadership moved before the ISR held it: %w", r.s.name, mqtt.ErrLeaderUnavailable)
		case checkMin && !ld.InSync():
			return fmt.Errorf("cluster: write state of %s: the ISR fell below min_insync_replicas: %w", r.s.name, mqtt.ErrNotEnoughReplicas)
		case held:
			return nil
		}
		var look <-chan time.Time
		if !taken.at.IsZero() && !ld.Current() {
			if r.s.l.givesUp(taken.at, taken.late) {
				return fmt.Errorf("cluster: write state of %s: %w", r.s.name, errStateFateUnknown)
			}
			if recheck == nil {
				recheck = time.NewTimer(session / 8)
			} else {
				recheck.Reset(session / 8)
			}
			look = recheck.C
		}
		select {
		case <-look:
		case <-changed:
		case <-stChanged:
		case <-ctx.Done():
			return fmt.Errorf("cluster: write state of %s: the ISR did not acknowledge it: %w (%w)", r.s.name, mqtt.ErrNotEnoughReplicas, ctx.Err())
		}
	}
}

// drain waits, once ld drains (Leader.Drain refuses state writes
// too), until every other ISR member has acknowledged the state writes
// of ld's leadership, which acks=leader answered without waiting; it
// reports whether they did before ctx ended.
func (r *replState) drain(ctx context.Context, ld *Leader) bool {
	r.mu.Lock()
	seq, mine := r.seq, r.leader == ld
	r.mu.Unlock()
	return mine && r.await(ctx, ld, seq, waitISR, stateTaken{}) == nil
}

// serveFetch answers a follower's state fetch: it records the seq
// the follower holds (its acknowledgement), then sends the changes after
// it, the whole state when the follower's version is of another
// leadership or older than the kept changes, or waits up to MaxWaitMs
// for a change.
func (r *replState) serveFetch(ctx context.Context, req *wire.StateFetchRequest) wire.StateFetchResponse {
	ld := r.s.noteLeader()
	if ld == nil {
		return wire.StateFetchResponse{Code: wire.NotLeader}
	}
	if c := ld.checkEpoch(req.LeaderEpoch); c != wire.None {
		return wire.StateFetchResponse{Code: c}
	}
	timer := time.NewTimer(min(time.Duration(req.MaxWaitMs)*time.Millisecond, maxFetchWait))
	defer timer.Stop()
	for {
		r.mu.Lock()
		if r.leader != ld {
			r.mu.Unlock()
			return wire.StateFetchResponse{Code: wire.NotLeader}
		}
		same := req.Epoch == r.epoch && req.Seq <= r.seq
		if cur, ok := r.acked[req.ReplicaID]; same && (!ok || req.Seq > cur) {
			if r.acked == nil {
				r.acked = map[string]uint64{}
			}
			r.acked[req.ReplicaID] = req.Seq
			r.notifyLocked()
		}
		if served, ok := r.served[req.ReplicaID]; same && ok {
			r.caught[req.ReplicaID] = req.Seq >= served
		}
		r.served[req.ReplicaID] = r.seq // what every answer below brings it to
		resp := wire.StateFetchResponse{Epoch: r.epoch, Seq: r.seq}
		switch {
		case !same || len(r.log) > 0 && req.Seq+1 < r.log[0].seq || len(r.log) == 0 && req.Seq < r.seq:
			resp.Reset = true
			err := r.s.st.LoadState("", func(k string, v []byte) error {
				resp.Puts = append(resp.Puts, wire.KV{Key: k, Val: slices.Clone(v)})
				return nil
			})
			r.mu.Unlock()
			if err != nil {
				return wire.StateFetchResponse{Code: wire.Unknown}
			}
			return resp
		case req.Seq < r.seq:
			puts, dels := map[string][]byte{}, map[string]bool{}
			for _, c := range r.log {
				if c.seq <= req.Seq {
					continue
				}
				for k, v := range c.puts {
					puts[k] = v
					delete(dels, k)
				}
				for _, k := range c.dels {
					delete(puts, k)
					dels[k] = true
				}
			}
			r.mu.Unlock()
			for _, k := range slices.Sorted(maps.Keys(puts)) {
				resp.Puts = append(resp.Puts, wire.KV{Key: k, Val: puts[k]})
			}
			resp.Dels = slices.Sorted(maps.Keys(dels))
			return resp
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return resp // nothing new
		case <-ctx.Done():
			return resp
		case <-r.s.stop:
			return wire.StateFetchResponse{Code: wire.NotLeader}
		}
	}
}
