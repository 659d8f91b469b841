package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/wire"
	"github.com/peatmq/peat/logstore"
	"github.com/peatmq/peat/mqtt"
)

// Consumer-state replication limits.
const (
	// stateLogMax is how many entries (keys put or deleted) of its recent
	// state writes a leader keeps to send a follower as changes; one
	// further behind gets the whole state.
	stateLogMax = 4096
	// stateFetchWait is a follower's long poll for state changes.
	stateFetchWait = 500 * time.Millisecond
	stateRetry     = 200 * time.Millisecond
)

// replState is a leader's consumer-state versions: every write it makes
// in its leadership (leader, epoch) gets the next seq, the recent ones
// are kept as changes, and each follower's state fetch acknowledges the
// seq it holds.
type replState struct {
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
	return s.writeState(ctx, ld, puts, dels, waitAcks)
}

// writeState is writeStateLeader with what to wait for.
func (s *stream) writeState(ctx context.Context, ld *Leader, puts map[string][]byte, dels []string, w stateWait) error {
	seq, err := s.stageState(ld, puts, dels, w)
	if err != nil {
		return err
	}
	return s.awaitState(ctx, ld, seq, w)
}

// stageState writes into the leader ld's store under the next seq, which
// it returns: what awaitState then waits for the ISR to acknowledge.
// Split so that a fenced write (writeStateFrom) holds claimDec while it
// is written, not while the ISR acknowledges it.
func (s *stream) stageState(ld *Leader, puts map[string][]byte, dels []string, w stateWait) (uint64, error) {
	if s.checksMin(w) && !ld.InSync() {
		return 0, fmt.Errorf("cluster: write state of %s: %w", s.name, mqtt.ErrNotEnoughReplicas)
	}
	r := &s.rs
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leader != ld {
		return 0, fmt.Errorf("cluster: write state of %s: leadership moved: %w", s.name, mqtt.ErrLeaderUnavailable)
	}
	// Under r.mu, so that drainState's seq counts every write let through.
	if w != waitNone && ld.draining() {
		return 0, fmt.Errorf("cluster: write state of %s: leadership ending: %w", s.name, mqtt.ErrLeaderUnavailable)
	}
	if err := s.st.WriteState(puts, dels); err != nil {
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
func (s *stream) checksMin(w stateWait) bool {
	return !s.l.acksLeader(s.name) && w != waitNone
}

// awaitState waits, unless w or the stream's acks say not to, until
// every other ISR member of the leader ld has acknowledged seq.
func (s *stream) awaitState(ctx context.Context, ld *Leader, seq uint64, w stateWait) error {
	if w != waitISR && (w != waitAcks || s.l.acksLeader(s.name)) {
		return nil
	}
	checkMin := s.checksMin(w)
	r := &s.rs
	for {
		st, stChanged := s.l.node.State()
		r.mu.Lock()
		changed := r.changed
		held := true
		if cs := st.Streams[s.name]; cs != nil {
			for _, id := range cs.ISR {
				if id != s.l.node.ID() && r.acked[id] < seq {
					held = false
				}
			}
		}
		r.mu.Unlock()
		switch {
		case s.leading() != ld:
			return fmt.Errorf("cluster: write state of %s: leadership moved before the ISR held it: %w", s.name, mqtt.ErrLeaderUnavailable)
		case checkMin && !ld.InSync():
			return fmt.Errorf("cluster: write state of %s: the ISR fell below min_insync_replicas: %w", s.name, mqtt.ErrNotEnoughReplicas)
		case held:
			return nil
		}
		select {
		case <-changed:
		case <-stChanged:
		case <-ctx.Done():
			return fmt.Errorf("cluster: write state of %s: the ISR did not acknowledge it: %w (%w)", s.name, mqtt.ErrNotEnoughReplicas, ctx.Err())
		}
	}
}

// drainState waits, once ld drains (Leader.Drain refuses state writes
// too), until every other ISR member has acknowledged the state writes
// of ld's leadership, which acks=leader answered without waiting; it
// reports whether they did before ctx ended.
func (s *stream) drainState(ctx context.Context, ld *Leader) bool {
	r := &s.rs
	r.mu.Lock()
	seq, mine := r.seq, r.leader == ld
	r.mu.Unlock()
	return mine && s.awaitState(ctx, ld, seq, waitISR) == nil
}

// forwardStateWrite passes a follower's state write to the leader,
// naming this node when the leader fences it (fromFor).
func (s *stream) forwardStateWrite(ctx context.Context, puts map[string][]byte, dels []string) error {
	leader, epoch, addr := s.stateLeader()
	if leader == "" || leader == s.l.node.ID() || addr == "" {
		return fmt.Errorf("cluster: write state of %s: no leader known: %w", s.name, mqtt.ErrLeaderUnavailable)
	}
	if n := len(puts) + len(dels); n > logstore.MaxStateWrite {
		return fmt.Errorf("cluster: write state of %s: %d entries, at most %d", s.name, n, logstore.MaxStateWrite)
	}
	from := s.fromFor(leader)
	req := wire.StateWriteRequest{Stream: s.name, LeaderEpoch: epoch, Dels: dels, Node: from.node, BrokerEpoch: from.epoch}
	for _, k := range slices.Sorted(maps.Keys(puts)) {
		req.Puts = append(req.Puts, wire.KV{Key: k, Val: puts[k]})
	}
	var resp wire.StateWriteResponse
	if err := s.rpc.call(ctx, s.l.node.dialer(), addr, wire.KindStateWriteRequest, req.AppendTo(nil), wire.KindStateWriteResponse, &resp); err != nil {
		return fmt.Errorf("cluster: write state of %s through %s: %v: %w", s.name, leader, err, mqtt.ErrLeaderUnavailable)
	}
	if resp.Code == wire.NotHolder && len(resp.Moved) > 0 {
		return &movedError{keys: resp.Moved}
	}
	return codeErr("write state of", s.name, resp.Code, resp.Message)
}

// serveStateWrite is the leader's side of a forwarded state write.
func (s *stream) serveStateWrite(ctx context.Context, req *wire.StateWriteRequest) wire.StateWriteResponse {
	ld := s.noteLeader()
	if ld == nil || ld.epoch != req.LeaderEpoch {
		return wire.StateWriteResponse{Code: wire.NotLeader}
	}
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout-time.Second) // answered before the follower gives up
	defer cancel()
	puts := make(map[string][]byte, len(req.Puts))
	for _, kv := range req.Puts {
		puts[kv.Key] = kv.Val
	}
	if err := s.writeStateFrom(ctx, ld, puts, req.Dels, stateFrom{req.Node, req.BrokerEpoch}); err != nil {
		if moved, ok := errors.AsType[*movedError](err); ok {
			return wire.StateWriteResponse{Code: wire.NotHolder, Message: err.Error(), Moved: moved.keys}
		}
		return wire.StateWriteResponse{Code: produceCode(err), Message: err.Error()}
	}
	return wire.StateWriteResponse{}
}

// serveStateFetch answers a follower's state fetch: it records the seq
// the follower holds (its acknowledgement), then sends the changes after
// it, the whole state when the follower's version is of another
// leadership or older than the kept changes, or waits up to MaxWaitMs
// for a change.
func (s *stream) serveStateFetch(ctx context.Context, req *wire.StateFetchRequest) wire.StateFetchResponse {
	ld := s.noteLeader()
	if ld == nil {
		return wire.StateFetchResponse{Code: wire.NotLeader}
	}
	if c := ld.checkEpoch(req.LeaderEpoch); c != wire.None {
		return wire.StateFetchResponse{Code: c}
	}
	r := &s.rs
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
			err := s.st.LoadState("", func(k string, v []byte) error {
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
		case <-s.stop:
			return wire.StateFetchResponse{Code: wire.NotLeader}
		}
	}
}

// followState is a follower's side: while another node leads the
// stream, one goroutine fetches the leader's consumer state into this
// replica's store; it is replaced when the leader or its epoch changes
// and ended while this node leads (ld non-nil).
type followState struct {
	stop   chan struct{} // closed by end
	cancel context.CancelFunc
	done   chan struct{}
	leader string
	epoch  uint32
	addr   string
	// The version held, (epoch, seq) of the leadership that sent it;
	// only the goroutine touches them while it runs.
	haveEpoch uint32
	haveSeq   uint64
}

func (s *stream) followState(ld *Leader) {
	fs := &s.fs
	leader, epoch, addr := s.stateLeader()
	want := ld == nil && leader != "" && leader != s.l.node.ID() && addr != ""
	if fs.cancel != nil && (!want || fs.leader != leader || fs.epoch != epoch || fs.addr != addr || fs.ended()) {
		fs.cancel()
		<-fs.done
		fs.cancel = nil
	}
	if !want || fs.cancel != nil {
		return
	}
	select {
	case <-fs.stop:
		return
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	fs.cancel, fs.done, fs.leader, fs.epoch, fs.addr = cancel, make(chan struct{}), leader, epoch, addr
	go s.fetchState(ctx, leader, epoch, addr)
}

func (fs *followState) ended() bool {
	select {
	case <-fs.done:
		return true
	default:
		return false
	}
}

// end stops the follower goroutine for good (the stream's run ends).
func (fs *followState) end() {
	close(fs.stop)
	if fs.cancel != nil {
		fs.cancel()
		<-fs.done
	}
}

func (s *stream) fetchState(ctx context.Context, leader string, epoch uint32, addr string) {
	fs := &s.fs
	defer close(fs.done)
	defer s.wake() // run looks again (a fenced fetch ends this one)
	for ctx.Err() == nil {
		err := s.stateSession(ctx, epoch, addr)
		var code wire.Code
		if ctx.Err() != nil {
			return
		}
		if errors.As(err, &code) && (code == wire.FencedLeaderEpoch || code == wire.NotLeader) {
			select { // the state moves on; run starts another after a pause
			case <-ctx.Done():
			case <-time.After(stateRetry):
			}
			return
		}
		if err != nil {
			s.l.log.Debug("cluster: state fetch", slog.String("stream", s.name), slog.String("leader", leader), slog.Any("err", err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(stateRetry):
		}
	}
}

// stateSession is one connection to the leader, fetching state changes.
func (s *stream) stateSession(ctx context.Context, epoch uint32, addr string) error {
	fs := &s.fs
	conn, err := s.l.node.dialer()(ctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	c := &fetchConn{conn: conn, wait: stateFetchWait + DefaultFetchTimeout}
	for {
		req := wire.StateFetchRequest{Stream: s.name, ReplicaID: s.l.node.ID(), LeaderEpoch: epoch,
			Epoch: fs.haveEpoch, Seq: fs.haveSeq, MaxWaitMs: uint32(stateFetchWait / time.Millisecond)}
		var resp wire.StateFetchResponse
		if err := c.roundTrip(wire.KindStateFetchRequest, req.AppendTo(nil), wire.KindStateFetchResponse, &resp); err != nil {
			return err
		}
		if resp.Code != wire.None {
			return resp.Code
		}
		if err := s.applyState(&resp); err != nil {
			return err
		}
		fs.haveEpoch, fs.haveSeq = resp.Epoch, resp.Seq
	}
}

// applyState writes a leader's answer into this replica's store: the
// changes, or, on Reset, the whole state (keys the leader lacks go), in
// writes of at most MaxStateWrite entries.
func (s *stream) applyState(resp *wire.StateFetchResponse) error {
	puts := map[string][]byte{}
	for _, kv := range resp.Puts {
		puts[kv.Key] = kv.Val
	}
	dels := resp.Dels
	if resp.Reset {
		dels = nil
		err := s.st.LoadState("", func(k string, v []byte) error {
			if _, keep := puts[k]; !keep {
				dels = append(dels, k)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	keys, gone := slices.Sorted(maps.Keys(puts)), dels
	for len(keys) > 0 || len(dels) > 0 {
		p := map[string][]byte{}
		for len(keys) > 0 && len(p) < logstore.MaxStateWrite {
			p[keys[0]] = puts[keys[0]]
			keys = keys[1:]
		}
		n := min(len(dels), logstore.MaxStateWrite-len(p))
		if err := s.st.WriteState(p, dels[:n]); err != nil {
			return err
		}
		dels = dels[n:]
	}
	s.claimsMoved(puts, gone)
	return nil
}
