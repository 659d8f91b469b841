package cluster

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/serf/serf"
	"github.com/peatmq/peat/cluster/rules"

	"github.com/peatmq/peat/logstore"
)

// Node is one member of a site: its Serf membership, its Raft server (a
// voter, or a non-voter that follows the controller's state), and, while
// its Raft server leads, the controller's loop.
//
// Goroutines, all started by Open and stopped and waited for by Close:
// eventLoop drains Serf's events; watchLeadership starts and stops
// leaderLoop as Raft leadership comes and goes; heartbeatLoop sends this
// node's heartbeats to the controller.
type Node struct {
	cfg     Config
	log     *slog.Logger
	epoch   uint64
	tls     *siteTLS            // nil: plain TCP
	keyring *memberlist.Keyring // nil: gossip in the clear

	fsm       *FSM
	store     *RaftStore
	snaps     raft.SnapshotStore
	trans     *raft.NetworkTransport
	raft      *raft.Raft
	serf      *serf.Serf
	events    chan serf.Event
	leaderCh  chan bool
	reconcile chan struct{} // cap 1: a member changed, the controller looks again

	sessions sessions // the controller's count of heartbeats (heartbeat.go)
	beat     beat     // this broker's heartbeats

	stop chan struct{}
	wg   sync.WaitGroup

	mu struct {
		sync.Mutex
		bootstrapped bool            // has Raft state, or bootstrapped it
		reaped       map[string]bool // voters Serf forgot, for the controller to remove
		closed       bool
	}
}

// brokerEpochKey keeps the last broker epoch in the KV space.
var brokerEpochKey = []byte("e")

// Open starts a node on kv (the node's logstore.Store): a new broker
// epoch, Raft on its stored state, Serf with the node's tags, and a join
// of cfg.Join.
func Open(cfg Config, kv KV) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:       cfg,
		log:       cfg.Logger,
		fsm:       NewFSM(),
		events:    make(chan serf.Event, 256),
		leaderCh:  make(chan bool, 8),
		reconcile: make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	n.log = n.log.With(slog.String("node", cfg.NodeID))
	n.mu.reaped = map[string]bool{}
	n.beat.born = time.Now()
	var err error
	if cfg.TLS != nil {
		if n.tls, err = loadTLS(cfg.TLS); err != nil {
			return nil, err
		}
	}
	if cfg.KeyringFile != "" {
		if n.keyring, err = loadKeyring(cfg.KeyringFile); err != nil {
			return nil, err
		}
	}
	if n.epoch, err = nextBrokerEpoch(kv, time.Now()); err != nil {
		return nil, err
	}
	if n.store, err = NewRaftStore(kv); err != nil {
		return nil, err
	}
	if err := n.startRaft(); err != nil {
		return nil, err
	}
	if err := n.startSerf(); err != nil {
		n.shutdownRaft()
		return nil, err
	}
	if n.tls != nil {
		n.tls.serf.Store(n.serf) // names are checked against its members from now on
	}
	n.wg.Add(3)
	go n.eventLoop()
	go n.watchLeadership()
	go n.heartbeatLoop()
	if len(cfg.Join) > 0 {
		if _, err := n.serf.Join(cfg.Join, true); err != nil {
			// Not fatal: a member started before its peers is joined by them.
			n.log.Warn("cluster: join", slog.Any("addrs", cfg.Join), slog.Any("err", err))
		}
	}
	n.maybeBootstrap()
	return n, nil
}

// nextBrokerEpoch returns a broker epoch above every earlier one of this
// node (the stored one plus 1, persisted before use) and, so that a node
// whose disk was replaced still outranks its old incarnation, at least the
// time in milliseconds.
func nextBrokerEpoch(kv KV, now time.Time) (uint64, error) {
	var last uint64
	switch v, err := kv.KVGet(brokerEpochKey); {
	case errors.Is(err, logstore.ErrNotFound):
	case err != nil:
		return 0, fmt.Errorf("cluster: read broker epoch: %w", err)
	case len(v) != 8:
		return 0, fmt.Errorf("cluster: stored broker epoch has %d bytes", len(v))
	default:
		last = binary.BigEndian.Uint64(v)
	}
	e := last + 1
	if ms := now.UnixMilli(); ms > 0 {
		e = max(e, uint64(ms))
	}
	if err := kv.KVWrite([]logstore.KV{{Key: brokerEpochKey, Value: binary.BigEndian.AppendUint64(nil, e)}}, nil); err != nil {
		return 0, fmt.Errorf("cluster: store broker epoch: %w", err)
	}
	return e, nil
}

// ID is the node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Epoch is the node's broker epoch for this run.
func (n *Node) Epoch() uint64 { return n.epoch }

// SerfAddr is the gossip address others join (with the port picked).
func (n *Node) SerfAddr() string {
	m := n.serf.LocalMember()
	return fmt.Sprintf("%s:%d", m.Addr, m.Port)
}

// RaftAddr is Raft's address (with the port picked).
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// State returns a copy of the controller's state as this node's Raft
// server has applied it, and a channel closed at its next change.
func (n *Node) State() (*rules.State, <-chan struct{}) { return n.fsm.State() }

// View is the current state, shared and never changed (FSM.View): read
// it, do not change it.
func (n *Node) View() *rules.State { return n.fsm.View() }

// Watch is View and a channel closed at the next change (FSM.Watch).
func (n *Node) Watch() (*rules.State, <-chan struct{}) { return n.fsm.Watch() }

// Controller returns the id of the controller (the Raft leader) this node
// knows of, "" when it knows none.
func (n *Node) Controller() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// IsController reports whether this node is the controller.
func (n *Node) IsController() bool { return n.raft.State() == raft.Leader }

// HearsController reports whether this node is the controller, or heard
// from it within the Raft heartbeat timeout and holds its broker session
// (heartbeat.go): the fence a stream's Leader commits under
// (Replicator.currentLeader). A node cut off longer may have been deposed
// without knowing it, so what acts as the leader outside the log (a
// site's sinks) stops too.
func (n *Node) HearsController() bool {
	if n.IsController() {
		return true
	}
	return rules.InTouch(false, time.Since(n.raft.LastContact()), n.cfg.HeartbeatTimeout) && n.sessionHeld()
}

// Members returns Serf's view of the site.
func (n *Node) Members() []Member {
	ms := n.serf.Members()
	out := make([]Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, memberOf(m))
	}
	return out
}

// Apply proposes c to the controller's state and waits until it is
// committed and applied; the error is the state machine's refusal, or
// ErrNotController on any node but the controller.
func (n *Node) Apply(ctx context.Context, c rules.Command) error {
	data, err := rules.EncodeCommand(c)
	if err != nil {
		return err
	}
	// raft's futures take a timeout, not a context: the context's deadline
	// bounds it (a cancellation without one is not seen until it ends).
	timeout := n.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := ctx.Err(); err != nil || timeout <= 0 {
		return fmt.Errorf("cluster: apply %T: %w", c, cmp.Or(err, context.DeadlineExceeded))
	}
	f := n.raft.Apply(data, timeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return fmt.Errorf("%w: %v", ErrNotController, err)
		}
		return fmt.Errorf("cluster: apply %T: %w", c, err)
	}
	if err, ok := f.Response().(error); ok && err != nil {
		return err
	}
	return nil
}

// Close stops the node without leaving: to the others it has failed, as
// after a crash (use Leave first to go gracefully). It is idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.mu.closed {
		n.mu.Unlock()
		return nil
	}
	n.mu.closed = true
	n.mu.Unlock()
	err := n.shutdownRaft()
	if serr := n.serf.Shutdown(); serr != nil && err == nil {
		err = fmt.Errorf("cluster: serf shutdown: %w", serr)
	}
	close(n.stop)
	n.wg.Wait()
	return err
}

// Join asks Serf to join the members at addrs; it returns how many
// answered.
func (n *Node) Join(addrs []string) (int, error) { return n.serf.Join(addrs, true) }

// Leave tells the site this node is going (the controller removes a voter
// that left from the quorum), then closes it.
func (n *Node) Leave() error {
	if err := n.serf.Leave(); err != nil {
		n.log.Warn("cluster: leave", slog.Any("err", err))
	}
	return n.Close()
}

func (n *Node) shutdownRaft() error {
	var err error
	if ferr := n.raft.Shutdown().Error(); ferr != nil {
		err = fmt.Errorf("cluster: raft shutdown: %w", ferr)
	}
	if terr := n.trans.Close(); terr != nil && err == nil {
		err = fmt.Errorf("cluster: raft transport: %w", terr)
	}
	// Close leaves the connections in its pool open, and each peer's
	// handler waits on its end of one for good: release them.
	n.trans.CloseStreams()
	return err
}

// nudge asks the controller loop, if this node runs it, to reconcile.
func (n *Node) nudge() {
	select {
	case n.reconcile <- struct{}{}:
	default:
	}
}

var _ io.Writer = logWriter{}

// Quorum returns the controller's Raft configuration as this node knows
// it: the voters' ids and the non-voters' ids (brokers that follow the
// state), each in id order.
func (n *Node) Quorum() (voters, nonvoters []string, err error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, nil, fmt.Errorf("cluster: raft configuration: %w", err)
	}
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, string(s.ID))
		} else {
			nonvoters = append(nonvoters, string(s.ID))
		}
	}
	slices.Sort(voters)
	slices.Sort(nonvoters)
	return voters, nonvoters, nil
}
