package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/peatmq/peat/cluster/rules"
	"github.com/peatmq/peat/logstore"
)

// The Replicator.
//
// One goroutine per node watches the state (the FSM every node applies):
// for each stream it holds a replica of, it runs a Leader (NewLeader sets
// the stream's leader epoch in logstore before any append) while the state
// names it leader, else a Fetcher from the leader the state names, which
// truncates to that leader's epoch end first. A change of leader or leader
// epoch stops the role and starts the new one; an ISR change the
// controller committed is handed to the Leader (SetISR), never earlier:
// the watermark never moves on a smaller ISR before the controller agreed.
// Every quarter of LagMax (replica_lag_max), at most isrCheck, a leader
// proposes AlterISR through Submit (rules.ProposeISR: dropping followers not caught up for
// LagMax or not heard from for the session timeout, adding those caught up in their current broker epoch); the
// compare-and-set on leader epoch and version refuses a deposed leader's
// proposals. After every pass it publishes the Leaders it runs (Leading),
// which the Log's appends ask. A node leads only once its state has
// registered its current broker epoch: a restarted node's state, restored
// from a snapshot, may name it the sole ISR member of a stream that moved
// on since, and the registration comes after all that (and fences the old
// incarnation's leaderships).
//
// A leader commits (moves its watermark) only while:
//
//   - its ISR has at least MinInsyncReplicas members (rules.Tracker; a
//     leader alone in its ISR commits nothing when the minimum is 2);
//   - this node's copy of the state still names it leader in its epoch;
//   - this node is the controller, or heard from it within the Raft
//     heartbeat timeout (1 s). The controller deposes a leader only after
//     an election it commits, for a failure Serf needs at least 1.5 s to
//     declare (the defaults); a leader cut off from it has stopped
//     committing by then. An asymmetric partition where Serf declares a
//     node failed while its Raft still hears the controller is not
//     covered by this argument.

// Replicator defaults.
const (
	// DefaultReplicaLagMax is replica_lag_max: how long an ISR member may
	// stay behind before its leader asks the controller to drop it (one
	// that sends no fetch at all goes after the session timeout).
	DefaultReplicaLagMax = 10 * time.Second
	replicatorRetry      = 500 * time.Millisecond
)

// ReplicatorConfig configures a node's replication manager.
type ReplicatorConfig struct {
	Node   *Node
	Server *Server // serves the streams this node leads
	// Stream returns this node's replica of a stream (a store with
	// ManualCommit), nil when the node holds none.
	Stream func(name string) *logstore.Stream
	// LagMax is replica_lag_max; 0: DefaultReplicaLagMax.
	LagMax time.Duration
	// MinInsyncReplicas: a leader whose ISR is smaller commits nothing
	// (acks=all is never answered); 1: no minimum; 0: the default, 2 for
	// a stream of 3 or more replicas, else 1 (rules.MinInsync).
	MinInsyncReplicas int
	// MinInsyncFor, when set, gives a stream's own minimum (0: the one
	// above).
	MinInsyncFor func(stream string) int
	FetchMaxWait time.Duration // 0: DefaultFetchMaxWait
	Log          *slog.Logger

	// beforeLead, set only by this package's tests (siteTest), runs
	// before a Leader starts: a test holds it to widen the moment the
	// state names this node leader and no Leader runs yet.
	beforeLead func(stream string)
}

// Replicator drives replication from the controller's state: for every
// stream this node holds a replica of, a Leader while the state names it
// leader, else a Fetcher from the leader the state names, each replaced
// when the leader or leader epoch changes. One goroutine watches the
// state; each role runs in its own, and Close stops and waits for all.
type Replicator struct {
	cfg  ReplicatorConfig
	log  *slog.Logger
	stop chan struct{}
	done chan struct{}
	kick chan struct{} // cap 1: a role ended, look again

	roles map[string]*role // by stream; only the watching goroutine touches it

	// leading is what Log's appends ask: the Leader this node runs per
	// stream, and a channel closed after every pass of sync (a leader or
	// ISR may have changed).
	leading struct {
		sync.Mutex
		leaders map[string]*Leader
		changed chan struct{}
	}
}

// role is what this node runs for one stream.
type role struct {
	leader   bool
	leaderID string
	epoch    uint32
	addr     string // the leader's cluster address, for a follower
	stream   *logstore.Stream
	minISR   int // the leader's min_insync_replicas

	l      *Leader
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *role) same(o *role) bool {
	return r.leader == o.leader && r.leaderID == o.leaderID && r.epoch == o.epoch && r.addr == o.addr &&
		r.stream == o.stream // a stream removed and added again locally is another replica
}

// StartReplicator starts the manager; Close stops it.
func StartReplicator(cfg ReplicatorConfig) *Replicator {
	if cfg.LagMax <= 0 {
		cfg.LagMax = DefaultReplicaLagMax
	}
	if cfg.FetchMaxWait <= 0 {
		cfg.FetchMaxWait = DefaultFetchMaxWait
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Replicator{cfg: cfg, log: log.With(slog.String("node", cfg.Node.ID())), stop: make(chan struct{}),
		done: make(chan struct{}), kick: make(chan struct{}, 1), roles: map[string]*role{}}
	r.leading.leaders = map[string]*Leader{}
	r.leading.changed = make(chan struct{})
	go r.run()
	return r
}

// Close stops every Leader and Fetcher and waits for them; idempotent.
func (r *Replicator) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

func (r *Replicator) run() {
	defer close(r.done)
	defer func() {
		for name, ro := range r.roles {
			r.end(name, ro)
		}
		clear(r.roles)
		r.publish()
	}()
	// Addresses come from Serf's tags, which may lag the state: look
	// again now and then as well as on every change.
	tick := time.NewTicker(replicatorRetry)
	defer tick.Stop()
	for {
		st, changed := r.cfg.Node.State()
		r.sync(st)
		select {
		case <-r.stop:
			return
		case <-changed:
		case <-r.kick:
		case <-tick.C:
		}
	}
}

// sync brings the running roles in line with st.
func (r *Replicator) sync(st *rules.State) {
	self := r.cfg.Node.ID()
	for name, ro := range r.roles {
		if want := r.want(st, name); want == nil || !want.same(ro) || ended(ro) {
			r.end(name, ro)
			delete(r.roles, name)
		}
	}
	for _, name := range st.StreamNames() {
		s := st.Streams[name]
		want := r.want(st, name)
		if want == nil {
			continue
		}
		if ro := r.roles[name]; ro != nil {
			if ro.leader {
				ro.l.SetISR(s.ISR) // committed by the controller: now the watermark may use it
				// Replicas come and go (reassign.go): the default minimum follows.
				if m := rules.MinInsync(r.minInsyncConfigured(name), len(s.Replicas)); m != ro.minISR {
					ro.minISR = m
					ro.l.SetMinInsync(m)
				}
			}
			continue
		}
		stream := r.cfg.Stream(name)
		r.log.Info("cluster: replica role", slog.String("stream", name), slog.Bool("leader", want.leader),
			slog.String("leader_id", want.leaderID), slog.Uint64("leader_epoch", uint64(want.epoch)))
		ctx, cancel := context.WithCancel(context.Background())
		want.cancel, want.done = cancel, make(chan struct{})
		if want.leader {
			if r.cfg.beforeLead != nil {
				r.cfg.beforeLead(name)
			}
			want.l = NewLeader(self, stream, want.epoch, s.ISR, r.log)
			want.minISR = rules.MinInsync(r.minInsyncConfigured(name), len(s.Replicas))
			want.l.SetMinInsync(want.minISR)
			want.l.SetCurrent(r.currentLeader(name, want.epoch))
			r.cfg.Server.Lead(want.l)
			go r.maintainISR(ctx, want, name)
		} else {
			go r.follow(ctx, want, stream)
		}
		r.roles[name] = want
	}
	r.publish()
}

// minInsyncConfigured is the stream's min_insync_replicas setting, else
// the node's; 0: the default.
func (r *Replicator) minInsyncConfigured(stream string) int {
	if r.cfg.MinInsyncFor != nil {
		if n := r.cfg.MinInsyncFor(stream); n > 0 {
			return n
		}
	}
	return r.cfg.MinInsyncReplicas
}

// publish hands the running Leaders to Leading and wakes its watchers.
func (r *Replicator) publish() {
	leaders := map[string]*Leader{}
	for name, ro := range r.roles {
		if ro.leader {
			leaders[name] = ro.l
		}
	}
	r.leading.Lock()
	r.leading.leaders = leaders
	close(r.leading.changed)
	r.leading.changed = make(chan struct{})
	r.leading.Unlock()
}

// Leading returns the Leader this node runs for stream (nil when it does
// not lead it), and a channel closed when the Replicator next looked at
// the state: a leader, its ISR or min_insync_replicas standing may have
// changed.
func (r *Replicator) Leading(stream string) (*Leader, <-chan struct{}) {
	r.leading.Lock()
	defer r.leading.Unlock()
	return r.leading.leaders[stream], r.leading.changed
}

// currentLeader is a Leader's fence (rules.MayCommit on this node's
// state and HearsController): a leader cut off from the
// controller stops committing after the heartbeat timeout (1 s), before
// Serf's failure detection (1.5 s at least with the defaults) lets the
// controller depose it, and one that hears the new state stops at once.
func (r *Replicator) currentLeader(name string, epoch uint32) func() bool {
	n := r.cfg.Node
	return func() bool {
		return rules.MayCommit(n.View(), name, n.ID(), epoch, n.HearsController())
	}
}

// want is the role the state gives this node for stream name
// (rules.Leader), nil for none: no replica here, no leader, a leadership
// of this node the state gives before it registered this incarnation, or
// the leader's address unknown yet.
func (r *Replicator) want(st *rules.State, name string) *role {
	self := r.cfg.Node.ID()
	leader, epoch, ok := rules.Leader(st, name, self, r.cfg.Node.Epoch())
	if !ok {
		return nil
	}
	stream := r.cfg.Stream(name)
	if stream == nil {
		return nil
	}
	if leader == self {
		return &role{leader: true, leaderID: self, epoch: epoch, stream: stream}
	}
	addr := r.cfg.Node.memberAddr(leader)
	if addr == "" {
		return nil
	}
	return &role{leaderID: leader, epoch: epoch, addr: addr, stream: stream}
}

func ended(ro *role) bool {
	select {
	case <-ro.done:
		return true
	default:
		return false
	}
}

// end stops a role and waits for it: a leader stops serving before its
// Leader closes, so that no fetch reaches a closed one.
func (r *Replicator) end(name string, ro *role) {
	if ro.leader {
		r.cfg.Server.Resign(name)
		ro.l.Close()
	}
	ro.cancel()
	<-ro.done
}

func (r *Replicator) nudge() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// follow runs Fetchers from the leader until ctx ends; a fetcher fenced
// by the leader (it moved on, or is not the leader any more) is started
// again after a pause, by then usually under a new state.
func (r *Replicator) follow(ctx context.Context, ro *role, stream *logstore.Stream) {
	defer r.nudge()      // second: the loop looks again at once, not at its next tick
	defer close(ro.done) // first: ended(ro) holds when it looks
	for ctx.Err() == nil {
		f := &Fetcher{Self: r.cfg.Node.ID(), BrokerEpoch: r.cfg.Node.Epoch(), Stream: stream, LeaderAddr: ro.addr,
			LeaderEpoch: ro.epoch, Dial: r.cfg.Node.dialer(), MaxWait: r.cfg.FetchMaxWait, Log: r.log}
		err := f.Run(ctx)
		if ctx.Err() != nil {
			return
		}
		r.log.Info("cluster: fetcher stopped", slog.String("stream", stream.Name()), slog.Any("err", err))
		if errors.Is(err, errLocal) {
			return // the replica refuses: nothing a retry cures
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(replicatorRetry):
		}
	}
}
